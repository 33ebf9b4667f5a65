#!/usr/bin/env python3
"""--no-save-optim (Megatron's): checkpoints with the weights and run state and no Adam moments.

- A run saved with --no-save-optim and the same run saved whole hold bitwise the same weights;
  its file has no /optimizer group, says optimizer_states = "none", is under half the size, and
  `hpct_ckpt verify` passes it (the same for a 2-rank ZeRO-2 --async-save);
- resuming it as a plain resume is refused in one line naming the file and --no-load-optim, before
  any step (no new checkpoint);
- resuming it with --no-load-optim trains on, with the same losses, bitwise, and the same final
  weights as the whole checkpoint resumed with --no-load-optim (both start Adam afresh: the
  moments the whole file holds are not read).

no_save_optim_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --mpiexec MPIEXEC --args FILE --data DIR --workdir DIR
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py", "numpy")
import h5py  # noqa: E402
import numpy as np  # noqa: E402

c = Checks("--gpt", "--tool", "--mpiexec", "--args", "--data", "--workdir")
a, check = c.args, c.check
w = a.workdir
data = ["--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", os.path.join(a.data, "gpt2-vocab.json"),
        "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]


def train(save, iters, *extra, ranks=1, want=0):
    cmd = [a.gpt, "@" + a.args, *data, "--seq-length", "64", "--eval-iters", "0", "--log-interval", "1",
           "--train-iters", str(iters), "--lr-decay-iters", "4", "--save", save, "--save-interval", "2", *extra]
    if ranks > 1:
        cmd = [a.mpiexec, "-n", str(ranks), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), *cmd]
    return c.run(cmd, want=want)


def losses(p):
    return re.findall(r"iteration +(\d+)/.*?lm loss: (\S+)", p.stdout)


def weights(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["model"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


lean, whole = os.path.join(w, "lean"), os.path.join(w, "whole")
train(lean, 2, "--no-save-optim")
train(whole, 2)
lf, wf = os.path.join(lean, "iter_0000002.h5"), os.path.join(whole, "iter_0000002.h5")
if check(os.path.exists(lf) and os.path.exists(wf), "both runs saved iteration 2"):
    with h5py.File(lf, "r") as f:
        check("optimizer" not in f and f.attrs.get("optimizer_states") in ("none", b"none"),
              "the --no-save-optim file has no /optimizer group and says optimizer_states = none")
    lw, ww = weights(lf), weights(wf)
    check(lw.keys() == ww.keys() and all(np.array_equal(lw[k], ww[k]) for k in lw), "the same weights, bitwise")
    ratio = os.path.getsize(lf) / os.path.getsize(wf)
    check(ratio < 0.5, f"its file is {ratio:.2f} of the whole one's size")
    v = c.run([a.tool, "verify", lf])
    check(v.returncode == 0, f"hpct_ckpt verify passes it: {v.stdout.strip().splitlines()[-1:] if v.stdout else v.stderr[-200:]}")

# A plain resume is refused before any step.
p = train(lean, 4, "--load", lean, want=None)
c.one_line_error("plain resume of a --no-save-optim checkpoint", p, "pretrain_gpt", ["iter_0000002.h5", "--no-load-optim"])
check(not os.path.exists(os.path.join(lean, "iter_0000004.h5")), "nothing saved by the refused resume")

# --no-load-optim: the same continuation from either file.
pl = train(lean, 4, "--load", lean, "--no-load-optim", "--no-save-optim")
pw = train(whole, 4, "--load", whole, "--no-load-optim")
ll, lw_ = losses(pl), losses(pw)
check(len(ll) == 2 and ll == lw_, f"--no-load-optim resumes: the same losses at iterations 3-4 ({ll} vs {lw_})")
l4, w4 = os.path.join(lean, "iter_0000004.h5"), os.path.join(whole, "iter_0000004.h5")
if os.path.exists(l4) and os.path.exists(w4):
    a4, b4 = weights(l4), weights(w4)
    check(all(np.array_equal(a4[k], b4[k]) for k in a4), "and the same weights at iteration 4, bitwise")
else:
    check(False, "both resumes saved iteration 4")

# Several ranks, ZeRO-2, the background writer.
z = os.path.join(w, "zero2")
train(z, 2, "--no-save-optim", "--zero-stage", "2", "--async-save", ranks=2)
zf = os.path.join(z, "iter_0000002.h5")
check(os.path.exists(zf) and c.run([a.tool, "verify", zf]).returncode == 0,
      "2 ranks, ZeRO-2, --async-save: a --no-save-optim checkpoint that verifies")
c.finish()
