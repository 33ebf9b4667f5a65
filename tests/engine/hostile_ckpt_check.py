#!/usr/bin/env python3
"""Damaged and hostile checkpoints and checkpoint directories (issue 17, items 4-7 and 9).

hostile_ckpt_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --args ARGS --workdir DIR

One rank, the tiny GPT on mock data. Each case edits a copy of a good checkpoint with h5py (the
tool users would reach for) or edits the directory, then expects `pretrain_gpt --load` to stop
with exit 1 and one error line that names the problem, `hpct_ckpt verify` to exit 1 (it runs every
check load runs), and nothing already saved to change.
"""
import hashlib
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py", "numpy")
import h5py  # noqa: E402
import numpy as np  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_forge import rechecksum, set_tensor, tensor_checksum, tensor_set_digest  # noqa: E402  (tests/engine/ckpt_forge.py)

c = Checks("--gpt", "--tool", "--generate", "--args", "--workdir")
a, check, fails = c.args, c.check, c.fails
base = [a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--log-interval", "1", "--eval-iters", "0", "--num-layers", "2",
        "--lr-decay-iters", "100"]  # one schedule for every run length (resumes may not change it)


def run(args, timeout=120):
    p = subprocess.run(base + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def errors(out):
    return [l for l in out.splitlines() if "error:" in l]


def digest(d):
    h = {}
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if os.path.isfile(p):
            h[n] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return h


good = os.path.join(a.workdir, "good")
rc, out = run(["--train-iters", "2", "--save", good])
check(rc == 0, f"a good checkpoint is saved (exit {rc})")
good_file = os.path.join(good, "iter_0000002.h5")


def refused_load(tag, d, want, extra=()):
    before = digest(d) if os.path.isdir(d) else None
    rc, out = run(["--train-iters", "4", "--load", d, "--save", d, *extra])
    errs = errors(out)
    check(rc == 1 and len(errs) == 1 and want in errs[0] and "[rank 0] [rank 0]" not in errs[0],
          f"{tag}: --load refused in one line with '{want}' (exit {rc}): {errs[:2] or out[-500:]}")
    if before is not None:
        check(digest(d) == before, f"{tag}: nothing in the directory changed")


def refused_verify(tag, path, want):
    p = subprocess.run([a.tool, "verify", path], capture_output=True, text=True)
    check(p.returncode == 1 and want in p.stderr + p.stdout,
          f"{tag}: hpct_ckpt verify exits 1 naming '{want}' (exit {p.returncode}): {(p.stderr or p.stdout)[-300:]}")


def edited(tag, fn):
    d = os.path.join(a.workdir, tag)
    shutil.copytree(good, d)
    with h5py.File(os.path.join(d, "iter_0000002.h5"), "r+") as f:
        fn(f)
    return d


# ---- item 4: checkpoints without `latest` are never taken for an empty directory ----
d = os.path.join(a.workdir, "no_latest")
shutil.copytree(good, d)
os.unlink(os.path.join(d, "latest"))
refused_load("no latest", d, "holds checkpoints (newest iter_0000002.h5) but no `latest`")
rc, out = run(["--train-iters", "4", "--save", d])
check(rc == 1 and "already holds checkpoints" in out and os.listdir(d) == ["iter_0000002.h5"],
      f"--save into a directory of another run's checkpoints without --load is refused (exit {rc})")
rc, out = run(["--train-iters", "3", "--load", os.path.join(d, "iter_0000002.h5"), "--save", d])
check(rc == 0 and "at iteration 2" in out, f"the named checkpoint file resumes into that directory (exit {rc})")

# ---- item 7: `latest` names a file of its directory, nothing else ----
elsewhere = os.path.join(a.workdir, "elsewhere")
shutil.copytree(good, elsewhere)
for tag, text, want in [("latest with a path", "../elsewhere/iter_0000002.h5", "not a checkpoint file name"),
                        ("latest with a NUL", "iter_0000002.h5\0x", "not a checkpoint file name"),
                        ("latest naming a directory", "iter_0000009.h5", "does not exist")]:
    d = os.path.join(a.workdir, tag.replace(" ", "_"))
    shutil.copytree(good, d)
    if tag.endswith("directory"):
        os.mkdir(os.path.join(d, "iter_0000009.h5"))
    with open(os.path.join(d, "latest"), "w") as f:
        f.write(text + "\n")
    refused_load(tag, d, want)
    refused_verify(tag, d, want)

# ---- items 5 and 6: damaged run state and tensors, refused by load and by verify alike ----
def set_attr(k, v):
    return lambda f: f.attrs.__setitem__(k, v)


def del_attr(k):
    return lambda f: f.attrs.__delitem__(k)


def reshape(f):
    name = "/model/final_layernorm/weight"
    data, attrs = f[name][()], dict(f[name].attrs)
    del f[name]
    f.create_dataset(name, data=data.reshape(2, -1))
    for k, v in attrs.items():
        f[name].attrs[k] = v


cases = [
    ("iteration -5", set_attr("iteration", np.int64(-5)), "'iteration' = -5"),
    ("iteration 1e15", set_attr("iteration", np.int64(10**15)), "run-state checksum"),
    ("consumed_samples -8", set_attr("consumed_samples", np.int64(-8)), "'consumed_samples' = -8"),
    ("optimizer step -1", set_attr("optimizer_step", np.int64(-1)), "'optimizer_step' = -1"),
    ("no architecture", del_attr("architecture"), "lacks the attribute 'architecture'"),
    ("architecture not JSON", set_attr("architecture", "{num_layers: 2"), "attribute 'architecture'"),
    ("loss scaler not a number", lambda f: (f.attrs.__setitem__("loss_scaler", '{"scale": "x"}'), rechecksum(f)),
     "needs a positive finite 'scale'"),
    # Issue 47 item 8: the checksum is required, or an edit (4 heads read as 8) would pass with it deleted.
    ("no run-state checksum", del_attr("run_state_checksum"), "lacks the attribute 'run_state_checksum'"),
    ("heads 4 -> 8, checksum deleted", lambda f: (f.attrs.__delitem__("run_state_checksum"), f.attrs.__setitem__(
        "architecture", '{"hidden_size":128,"model":"gpt","num_attention_heads":8,"num_layers":2,'
                        '"padded_vocab_size":512,"seq_length":128}')), "lacks the attribute 'run_state_checksum'"),
    ("unknown format", set_attr("format", "hpctrain-checkpoint/99"), "has format 'hpctrain-checkpoint/99'"),
    ("iteration as an array", set_attr("iteration", np.arange(1000, dtype=np.int64)), "holds 1000 elements"),
    ("tokenizer as a string array", set_attr("tokenizer", np.array(["a", "b"], dtype=h5py.string_dtype())), "holds 2 elements"),
    ("no iteration", del_attr("iteration"), "lacks the integer attribute 'iteration'"),
    ("iteration 4.7", set_attr("iteration", np.float64(4.7)), "attribute 'iteration' of / is not an integer"),  # item 11
    ("heads 4 -> 8", set_attr("architecture", '{"hidden_size":128,"model":"gpt","num_attention_heads":8,"num_layers":2,'
                                              '"padded_vocab_size":512,"seq_length":128}'), "run-state checksum"),
    ("tensor deleted", lambda f: f.__delitem__("/optimizer/exp_avg/layers/1/attention/dense/bias"),
     "has no tensor /optimizer/exp_avg/layers/1/attention/dense/bias"),
    ("tensor reshaped", reshape, "tensor /model/final_layernorm/weight has shape [2, 64]"),
]
for tag, fn, want in cases:
    d = edited(tag.replace(" ", "_"), fn)
    refused_load(tag, d, want)
    refused_verify(tag, d, want)

# An architecture claiming a million experts (its run-state checksum recomputed, FNV-1a being public):
# verify counts the tensors it would need before building their table, instead of listing 4 million names.
tag = "a million experts"
d = edited("million_experts", lambda f: (f.attrs.__setitem__(
    "architecture", '{"expert_interval":2,"hidden_size":64,"mlp_type":"standard","model":"gpt","num_attention_heads":2,'
                    '"num_experts":[1000000],"num_layers":2,"padded_vocab_size":512,"seq_length":32,"topk":1}'),
                                         rechecksum(f)))
refused_verify(tag, d, "needs 12000")

# The checksum recomputed: the range checks behind it still hold.
d = edited("rechecksummed_bad_step", lambda f: (f.attrs.__setitem__("optimizer_step", np.int64(7)), rechecksum(f)))
refused_load("optimizer step past the iteration, no checksum", d, "optimizer_step 7 > iteration 2")

# ---- issue 47 item 5: every weights-only load checks the tensors' checksums ----
# One flipped bit in a weight: --load and verify refused it, but generate, export and --finetune
# --load used it with exit 0.
FLIPPED = "/model/layers/1/attention/dense/weight"


def flip(f):
    x = f[FLIPPED][...]
    x.reshape(-1).view("<u4")[5] ^= 1 << 20
    f[FLIPPED][...] = x


with h5py.File(os.path.join(good, "iter_0000002.h5"), "r") as f:
    check(int(f[FLIPPED].attrs["checksum"]) == tensor_checksum(f[FLIPPED][...]),
          "the test's tensor checksum is the checkpointer's (so the forged NaN below passes it)")
d = edited("flipped_weight", flip)
for tag, cmd in (("generate", [a.generate, "--load", d, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]),
                 ("export", [a.tool, "export", d, os.path.join(a.workdir, "flipped_export", "model.safetensors")]),
                 ("--finetune --load", base + ["--train-iters", "1", "--finetune", "--load", d])):
    os.makedirs(os.path.join(a.workdir, "flipped_export"), exist_ok=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    errs = errors(p.stdout)
    check(p.returncode != 0 and len(errs) == 1 and FLIPPED in errs[0] and "fails its checksum" in errs[0],
          f"flipped bit: {tag} refused in one line naming {FLIPPED} (exit {p.returncode}): {errs or p.stdout[-300:]}")
check(not os.path.exists(os.path.join(a.workdir, "flipped_export", "model.safetensors")), "flipped bit: export wrote no file")

# ---- issue 47 item 13: a stored checksum is bound to its tensor's name and shape ----
A, B = "/model/layers/0/attention/dense/weight", "/model/layers/1/attention/dense/weight"
with h5py.File(os.path.join(good, "iter_0000002.h5"), "r") as f:
    check(int(f.attrs["tensor_checksums"]) == tensor_set_digest(f), "the test's tensor_checksums is the checkpointer's")


def swap(f):  # two same-shape tensors exchanged between layers, each with its own checksum
    f.move(A, A + "_tmp")
    f.move(B, A)
    f.move(A + "_tmp", B)


def alias(f):  # layer 1's tensor replaced by a hard link to layer 0's (its data and checksum)
    del f[B]
    f[B] = f[A]


for tag, fn in (("swapped tensors", swap), ("hard-link alias", alias)):
    d = edited(tag.replace(" ", "_"), fn)
    refused_load(tag, d, "fails its tensor_checksums")
    refused_verify(tag, d, "fails its tensor_checksums")
    p = subprocess.run([a.generate, "--load", d, "--prompt-ids", "1,2", "--max-new-tokens", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    check(p.returncode != 0 and "fails its tensor_checksums" in p.stdout, f"{tag}: generate refused (exit {p.returncode})")
d = edited("no_tensor_checksums", del_attr("tensor_checksums"))
refused_load("no tensor_checksums", d, "lacks the attribute 'tensor_checksums'")

# ---- item 6: another seed or another tokenizer than the checkpoint's ----
refused_load("another --seed", elsewhere, "differs from the checkpoint's seed 1234", extra=["--seed", "99"])
d = os.path.join(a.workdir, "tokenizer")
shutil.copytree(good, d)
refused_load("another tokenizer", d, "was trained with tokenizer 'mock (vocab 512)'", extra=["--vocab-size", "500"])

# ---- item 11: outputs that cannot be written are found before training, not after it ----
for tag, extra, want in [("--json in a missing directory", ["--json", "/nonexistent/dir/summary.json"], "--json /nonexistent/dir/summary.json: the directory /nonexistent/dir does not exist"),
                         ("--metrics-file naming a directory", ["--metrics-file", a.workdir], "is a directory"),
                         ("--save naming a file", ["--save", good_file], "is not a directory")]:
    rc, out = run(["--train-iters", "2", *extra])
    errs = errors(out)
    check(rc == 1 and len(errs) == 1 and want in errs[0] and " iteration " not in out,
          f"{tag}: refused before training (exit {rc}): {errs[:1]}")

# ---- item 12: a resume at another global batch size logs the samples really consumed ----
d = os.path.join(a.workdir, "batch_change")
shutil.copytree(good, d)  # 2 iterations at global batch 2: 4 samples
m = os.path.join(a.workdir, "batch_change.jsonl")
p = subprocess.run([x if x != "2" or base[i - 1] != "--global-batch-size" else "6" for i, x in enumerate(base)] +
                   ["--train-iters", "4", "--load", d, "--metrics-file", m],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
import json
rows = {r["iteration"]: r for r in map(json.loads, open(m)) if r.get("type") == "train"} if p.returncode == 0 else {}
check(rows.get(3, {}).get("consumed_samples") == 10 and rows.get(4, {}).get("consumed_samples") == 16,
      f"after 4 samples at batch 2, batch 6 logs 10 and 16 consumed samples: {[(k, v.get('consumed_samples')) for k, v in rows.items()]}")
check("consumed samples:           10" in p.stdout, "the log line says 10 consumed samples at iteration 3")

c.finish()
