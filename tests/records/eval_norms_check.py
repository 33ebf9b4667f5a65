#!/usr/bin/env python3
"""--log-optimizer-states-to-tensorboard and --skip-train, as a user meets them.

eval_norms_check.py --gpt PRETRAIN_GPT --mpi "MPIEXEC -n 2 ..." --workdir DIR

- 1 rank, ZeRO 0: the TensorBoard norms of the last iteration (optimizer/weight_l2, momentum_l2,
  variance_l2) equal the L2 norms of the checkpoint's fp32 weights, exp_avg and exp_avg_sq, read
  with h5py (relative 1e-6: float32 TensorBoard values of double sums); the metrics file's
  `optimizer` fields hold the same norms at every iteration (relative 1e-6, the float32 rounding),
  with or without a TensorBoard directory (bitwise: the same deterministic run);
- 2 ranks, ZeRO 3 (each rank holds half of every block): the same norms at every iteration as
  1 rank (relative 1e-5: the DP reductions add in another order);
- --skip-train on that checkpoint evaluates and stops: the validation loss equals the training
  run's final evaluation (same parameters, same batches: relative 1e-12), no iteration runs, the
  summary says exit_reason "skip_train"; without a checkpoint it is a one-line error.
"""
import json
import math
import os
import re
import subprocess
import sys

try:
    import google.protobuf  # noqa: F401
    import h5py
    import numpy as np
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tfevents  # noqa: E402
from checklib import Checks  # noqa: E402

c = Checks("--gpt", "--mpi", "--workdir")
a = c.args
check = c.check
w = a.workdir
base = [a.gpt, "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3", "--mock-data", "--vocab-size", "256",
        "--train-iters", "6", "--log-interval", "1", "--eval-iters", "2", "--eval-interval", "6"]


def run(cmd, rc=0):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != rc:
        print(p.stdout[-3000:])
    check(p.returncode == rc, f"{' '.join(cmd[-4:])}: exit {p.returncode} (expected {rc})")
    return p.stdout


TAGS = ["optimizer/weight_l2", "optimizer/momentum_l2", "optimizer/variance_l2"]
one = os.path.join(w, "one")
os.makedirs(one)
run(base + ["--tensorboard-dir", one + "/tb", "--log-optimizer-states-to-tensorboard", "--save", one + "/ck",
            "--json", one + "/train.json", "--metrics-file", one + "/train.jsonl"])
two = os.path.join(w, "two")
run(a.mpi.split() + base + ["--tensorboard-dir", two + "/tb", "--log-optimizer-states-to-tensorboard", "--zero-stage", "3"])
s1, s2 = tfevents.scalars(one + "/tb"), tfevents.scalars(two + "/tb")
for t in TAGS:
    check([p[0] for p in s1.get(t, [])] == list(range(1, 7)), f"{t}: one value per iteration")
with h5py.File(os.path.join(one, "ck", "iter_0000006.h5"), "r") as h:
    sq = {"weight": 0.0, "exp_avg": 0.0, "exp_avg_sq": 0.0}

    def add(name, obj):
        if isinstance(obj, h5py.Dataset):
            key = "exp_avg_sq" if "/exp_avg_sq/" in "/" + name else "exp_avg" if "/exp_avg/" in "/" + name else "weight"
            sq[key] += float(np.sum(obj[...].astype(np.float64) ** 2))

    h.visititems(add)
recs = [json.loads(l) for l in open(one + "/train.jsonl")]
opt = {r["iteration"]: r.get("optimizer", {}) for r in recs if r.get("type") == "train"}
for t in TAGS:
    key = t.split("/")[1]
    check(sorted(opt) == list(range(1, 7)) and all(math.isclose(opt[i].get(key, float("nan")), v, rel_tol=1e-6)
                                                   for i, v, *_ in s1.get(t, [])),
          f"metrics file optimizer.{key} = TensorBoard's {t} at every iteration")
run(base + ["--log-optimizer-states-to-tensorboard", "--metrics-file", one + "/no_tb.jsonl"])
alone = {r["iteration"]: r.get("optimizer") for r in map(json.loads, open(one + "/no_tb.jsonl")) if r.get("type") == "train"}
check(alone == opt, "without --tensorboard-dir the metrics file still gets the optimizer norms, the same ones")
for t, k in zip(TAGS, ["weight", "exp_avg", "exp_avg_sq"]):
    got = s1[t][-1][1] if s1.get(t) else float("nan")
    check(math.isclose(got, math.sqrt(sq[k]), rel_tol=1e-6), f"{t} at iteration 6 = ||{k}|| of the checkpoint: {got} vs {math.sqrt(sq[k])}")
    pairs = list(zip(s1.get(t, []), s2.get(t, [])))
    check(len(pairs) == 6 and all(math.isclose(x[1], y[1], rel_tol=1e-5) for x, y in pairs),
          f"{t}: ZeRO 3 on 2 ranks = 1 rank at every iteration")

# --skip-train
trained = json.load(open(one + "/train.json"))
out = run(base + ["--load", one + "/ck", "--skip-train", "--json", one + "/eval.json", "--metrics-file", one + "/eval.jsonl"])
ev = json.load(open(one + "/eval.json"))
check(not re.search(r"^( \[[^]]*\])? iteration +\d+/", out, re.M) and "validation loss at iteration 6" in out, "--skip-train runs no iteration and evaluates at 6")
check(ev.get("exit_reason") == "skip_train" and ev.get("iterations") == 6, f"summary: exit_reason skip_train at 6 ({ev.get('exit_reason')})")
check(math.isclose(ev.get("final_val_loss", 0), trained["final_val_loss"], rel_tol=1e-12),
      f"validation loss {ev.get('final_val_loss')} = the training run's {trained['final_val_loss']}")
err = run(base + ["--load", one + "/ck", "--skip-train", "--metrics-file", one + "/eval.jsonl"], rc=1)
check("--skip-train would append" in err and "eval.jsonl" in err, "--skip-train refuses a metrics file that holds records")
err = run(base + ["--skip-train"], rc=1)
check("--skip-train" in err and "--load" in err, "--skip-train without a checkpoint: one-line error naming --load")
c.finish()
