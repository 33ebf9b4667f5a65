#!/usr/bin/env python3
"""--log-params-norm (Megatron's): the log line's "params norm" and the metrics file's params_norm
are the L2 norm of the fp32 weights after the step, the weights the checkpoint of that step holds
(every model tensor, vocabulary padding rows included), within 1e-6 relative (the norm's partial
sums are taken per shard and block in double; the file's in float64 here). Checked at ZeRO stage 2
over 2 ranks (the sum over shards) and at TP 2 (tensor-parallel parts and replicas counted once);
without the flag the line has no params norm.

--log-num-zeros-in-grad (Megatron's): the log line's "num zeros" and the metrics file's num_zeros at
step 1 are the zeros of the reduced gradient, counted independently as the zeros of the step-1
checkpoint's Adam exp_avg ((1 - beta1) x gradient: zero exactly where the gradient is); exact, at
ZeRO-2 over 2 ranks, TP 2, one rank and bf16 (16-bit gradients) (which must agree), and equal to the structural zeros: the
padded vocabulary rows and the position rows past --seq-length never get a gradient, every other
element does (the tied head's softmax reaches every real vocabulary row).

params_norm_check.py --gpt PRETRAIN_GPT --mpiexec MPIEXEC --args FILE --data DIR --workdir DIR
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py", "numpy")
import h5py  # noqa: E402
import numpy as np  # noqa: E402

c = Checks("--gpt", "--mpiexec", "--args", "--data", "--workdir")
a, check = c.args, c.check
data = ["--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", os.path.join(a.data, "gpt2-vocab.json"),
        "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]


def run(label, ranks, *extra):
    out = os.path.join(a.workdir, label)
    cmd = [a.gpt, "@" + a.args, *data, "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0", "--seq-length", "64",
           "--max-position-embeddings", "128", "--save", os.path.join(out, "ckpt"), "--save-interval", "1",
           "--metrics-file", out + ".jsonl", *extra]
    if ranks > 1:
        cmd = [a.mpiexec, "-n", str(ranks), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), *cmd]
    p = c.run(cmd)
    recs = [json.loads(x) for x in open(out + ".jsonl")] if os.path.exists(out + ".jsonl") else []
    return p, [r for r in recs if r.get("type") == "train"], os.path.join(out, "ckpt", "iter_0000002.h5")


def file_sum(path, group, per_tensor):
    """The sum of per_tensor(array) over every tensor of a checkpoint group."""
    total = 0
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            nonlocal total
            if isinstance(obj, h5py.Dataset):
                total += per_tensor(obj[()])
        f[group].visititems(visit)
    return total


def file_norm(path):
    return math.sqrt(file_sum(path, "model", lambda x: float(np.sum(np.square(x.astype(np.float64))))))


def file_zeros(path):
    return file_sum(path, "optimizer/exp_avg", lambda x: int(np.count_nonzero(x == 0)))


counts = {}


for label, ranks, extra in (("zero2", 2, ["--zero-stage", "2"]), ("tp2", 2, ["--tensor-model-parallel-size", "2"]),
                            ("one", 1, []), ("bf16", 1, ["--bf16"])):
    p, train, ck = run(label, ranks, "--log-params-norm", "--log-num-zeros-in-grad", *extra)
    ck1 = ck.replace("iter_0000002", "iter_0000001")
    zeros = [float(ln.split("num zeros:")[1].split("|")[0]) for ln in p.stdout.splitlines() if "num zeros:" in ln]
    want_zeros = file_zeros(ck1) if os.path.exists(ck1) else -1
    got_zeros = train[0].get("num_zeros") if train else None
    counts[label] = got_zeros
    check(got_zeros == want_zeros and len(zeros) == 2 and zeros[0] == want_zeros,
          f"{label}: num zeros at step 1 (file {got_zeros}, log {zeros[:1]}) = the zeros of the step-1 exp_avg {want_zeros}")
    logged = [float(ln.split("params norm:")[1].split("|")[0]) for ln in p.stdout.splitlines() if "params norm:" in ln]
    want = file_norm(ck) if os.path.exists(ck) else float("nan")
    got = train[-1].get("params_norm") if train else None
    check(got is not None and abs(got - want) <= 1e-6 * want,
          f"{label}: params_norm after step 2 {got} = the checkpoint's weights' L2 norm {want:.9f}")
    check(len(logged) == 2 and abs(logged[-1] - want) < 1e-3, f"{label}: the log line's params norm {logged} (3 decimals)")
# Structural zeros: padded vocabulary rows (50257 -> 50304) and positions 64..127, hidden 128.
structural = (50304 - 50257) * 128 + (128 - 64) * 128
check(all(v == structural for v in counts.values()),
      f"num zeros at every layout are the {structural} structural zeros: {counts}")
p, train, _ = run("plain", 1)
check("params norm" not in p.stdout and train and "params_norm" not in train[-1], "without the flag: no params norm")
check("num zeros" not in p.stdout and train and "num_zeros" not in train[-1], "without the flag: no num zeros")
c.finish()
