#!/usr/bin/env python3
"""--finetune-resume-optimizer: finetuning from a checkpoint with its Adam moments.

A tiny GPT is pretrained 4 steps (checkpoint A: iteration 4, optimizer step 4). From A, one
finetuning step twice: B0 (plain --finetune: fresh optimizer) and B (--finetune-resume-optimizer).
Both see the same weights and the same samples, so the same gradient g; hence, read back with h5py
from the three files, for every tensor:
  exp_avg(B) - exp_avg(B0) = beta1 * exp_avg(A)   and   exp_avg_sq(B) - exp_avg_sq(B0) = beta2 * exp_avg_sq(A)
(fp32 rounding of one multiply-add: within 1e-6 of the largest moment, well below the moments'
size: a fresh optimizer, or moments not carried, miss by the whole beta * m(A)). B records
optimizer_step_base 4 (Adam's bias correction continues at step 5: the biases' update is checked
against the formula), iteration 1 and optimizer step 1,
passes `hpct_ckpt verify` (the base is in the run-state checksum), and its weights differ from B0's.
A requeued B (2 iterations: 1, save, resume) ends with the weights of 2 straight iterations, bitwise.
--finetune-resume-optimizer without --finetune is one line naming the flag.
Start weights under tensor parallelism: --finetune (with and without the optimizer) from the T = 1
checkpoint at T = 2 on two ranks gives the T = 1 losses within 1e-5 relative (the tensor-parallel
tolerance: partial sums in another order, docs/tensor-parallel.md).

finetune_optimizer_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --mpiexec MPIEXEC --workdir DIR
"""
import os
import shutil
import sys

try:
    import h5py
    import numpy as np
except ImportError:  # Debian's python3-h5py (scripts/install_deps.sh): run under that python
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--tool", "--mpiexec", "--workdir")
a, check = c.args, c.check
B1, B2 = 0.9, 0.95
model = ["--mock-data", "--vocab-size", "128", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--lr-decay-iters", "10",
         "--adam-beta1", str(B1), "--adam-beta2", str(B2), "--eval-iters", "0", "--log-interval", "1"]
d = {k: os.path.join(a.workdir, k) for k in ("A", "B0", "B", "Bsplit", "Bstraight")}
for p in d.values():
    shutil.rmtree(p, ignore_errors=True)
c.run([a.gpt, *model, "--train-iters", "4", "--save", d["A"], "--save-interval", "4"])
ft = [a.gpt, *model, "--finetune", "--load", d["A"]]
c.run(ft + ["--train-iters", "1", "--save", d["B0"]])
c.run(ft + ["--finetune-resume-optimizer", "--train-iters", "1", "--save", d["B"]])


def ckpt(name, it):
    return h5py.File(os.path.join(d[name], f"iter_{it:07d}.h5"), "r")


def tensors(h, group):
    out = {}
    h[group].visititems(lambda n, o: out.__setitem__(n, np.array(o, dtype=np.float64)) if isinstance(o, h5py.Dataset) else None)
    return out


with ckpt("A", 4) as fa, ckpt("B0", 1) as f0, ckpt("B", 1) as fb:
    for group, beta in (("optimizer/exp_avg", B1), ("optimizer/exp_avg_sq", B2)):
        ma, m0, mb = tensors(fa, group), tensors(f0, group), tensors(fb, group)
        scale = max(max(abs(x).max() for x in ma.values()), max(abs(x).max() for x in m0.values()))
        worst = max(abs(mb[k] - m0[k] - beta * ma[k]).max() for k in ma)
        check(len(ma) > 10 and worst <= 1e-6 * scale,
              f"{group}: B - B0 = {beta} x A over {len(ma)} tensors (worst {worst:.2e}, moments up to {scale:.2e})")
    attrs = {k: int(fb.attrs[k]) for k in ("iteration", "optimizer_step", "optimizer_step_base")}
    check(attrs == {"iteration": 1, "optimizer_step": 1, "optimizer_step_base": 4}, f"B's run state {attrs}")
    check("optimizer_step_base" not in f0.attrs, "B0 (fresh optimizer) records no step base")
    w0, wb = tensors(f0, "model"), tensors(fb, "model")
    check(any((w0[k] != wb[k]).any() for k in w0), "the carried moments change the finetuning step")
    # Adam's bias correction continues at step 5: on the biases (no weight decay) the update is
    # lr * mhat / (sqrt(vhat) + eps), mhat = m / (1 - b1^5), vhat = v / (1 - b2^5), lr = 0.9e-3 (step 1 of
    # the new linear schedule). Restarting the count at 1 would make it about 1.9x larger.
    wa, m, v = tensors(fa, "model"), tensors(fb, "optimizer/exp_avg"), tensors(fb, "optimizer/exp_avg_sq")
    worst = size = 0.0
    for k in (k for k in wa if k.endswith("bias")):
        want = 0.9e-3 * (m[k] / (1 - B1 ** 5)) / (np.sqrt(v[k] / (1 - B2 ** 5)) + 1e-8)
        worst, size = max(worst, abs((wa[k] - wb[k]) - want).max()), max(size, abs(want).max())
    check(size > 0 and worst <= 1e-4 * size, f"biases moved by Adam at step 5 (worst {worst:.2e} of updates up to {size:.2e})")
p = c.run([a.tool, "verify", os.path.join(d["B"], "iter_0000001.h5")], want=None)
check(p.returncode == 0, f"hpct_ckpt verify passes on B (rc {p.returncode})")

# A requeued finetuning job resumes its own checkpoint (with its step base): 1 + 1 == 2 straight.
c.run(ft + ["--finetune-resume-optimizer", "--train-iters", "2", "--save", d["Bstraight"]])
c.run(ft + ["--finetune-resume-optimizer", "--train-iters", "2", "--save", d["Bsplit"], "--exit-interval", "1"])
c.run(ft + ["--finetune-resume-optimizer", "--train-iters", "2", "--save", d["Bsplit"]])
with ckpt("Bstraight", 2) as fs, ckpt("Bsplit", 2) as fr:
    ws, wr = tensors(fs, "model"), tensors(fr, "model")
    check(all((ws[k] == wr[k]).all() for k in ws), "requeued at iteration 1: the weights of 2 straight iterations, bitwise")
    check(int(fr.attrs["optimizer_step_base"]) == 4, "the resumed run keeps the step base")



def losses(metrics):
    import json
    return [r["lm_loss"] for r in map(json.loads, open(metrics)) if r.get("type") == "train"]


mpi = [a.mpiexec, "-n", "2", "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
for extra in ([], ["--finetune-resume-optimizer"]):
    got = {}
    for tp in (1, 2):
        m = os.path.join(a.workdir, f"tp{tp}{len(extra)}.jsonl")
        if os.path.exists(m):
            os.remove(m)
        c.run(([] if tp == 1 else mpi) + ft + extra + ["--train-iters", "3", "--tensor-model-parallel-size", str(tp),
                                                      "--metrics-file", m])
        got[tp] = losses(m)
    check(len(got[1]) == 3 and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(got[2], got[1])),
          f"--finetune {' '.join(extra)} at T=2 gives the T=1 losses ({got[2]} vs {got[1]})")

# --no-load-optim: resume A (iteration 4) with fresh moments for one step, to C (iteration 5). One
# step from zero moments gives m = (1 - b1) g and v = (1 - b2) g^2, so m^2 / v = (1 - b1)^2 / (1 - b2)
# = 0.2 for every element with a gradient (carried moments would not); the bias correction restarts
# at step 1 (the biases move by lr * g / (|g| + eps), lr the logged one), the schedule and iteration
# continue; C stores the negative step base and passes verify; a plain resume carries the moments.
import json  # noqa: E402
for k in ("C", "D"):
    shutil.rmtree(os.path.join(a.workdir, k), ignore_errors=True)
d["C"], d["D"] = os.path.join(a.workdir, "C"), os.path.join(a.workdir, "D")
shutil.copytree(d["A"], d["C"])
shutil.copytree(d["A"], d["D"])
mc = os.path.join(a.workdir, "C.jsonl")
pc = c.run([a.gpt, *model, "--train-iters", "5", "--load", d["C"], "--save", d["C"], "--no-load-optim", "--metrics-file", mc])
c.run([a.gpt, *model, "--train-iters", "5", "--load", d["D"], "--save", d["D"]])
check("--no-load-optim: Adam's moments" in pc.stdout, "the resume says the moments start afresh")
with ckpt("A", 4) as fa, ckpt("C", 5) as fc, ckpt("D", 5) as fd:
    for name, f, fresh in (("C", fc, True), ("D", fd, False)):
        m, v = tensors(f, "optimizer/exp_avg"), tensors(f, "optimizer/exp_avg_sq")
        vmax = max(x.max() for x in v.values())
        ratios = np.concatenate([(m[k] ** 2 / v[k])[v[k] > 1e-12 * vmax].ravel() for k in v])
        worst = float(np.abs(ratios - (1 - B1) ** 2 / (1 - B2)).max())
        check((worst <= 1e-4) == fresh, f"{name}: m^2/v {'=' if fresh else '!='} 0.2 everywhere (worst deviation {worst:.2e})")
    attrs = {k: int(fc.attrs[k]) for k in ("iteration", "optimizer_step", "optimizer_step_base")}
    check(attrs == {"iteration": 5, "optimizer_step": 5, "optimizer_step_base": -4}, f"C's run state {attrs}")
    lr5 = [r["learning_rate"] for r in map(json.loads, open(mc)) if r.get("type") == "train"][-1]
    wa, wc = tensors(fa, "model"), tensors(fc, "model")
    m, v = tensors(fc, "optimizer/exp_avg"), tensors(fc, "optimizer/exp_avg_sq")
    worst = size = 0.0
    for k in (k for k in wa if k.endswith("bias")):
        want = lr5 * (m[k] / (1 - B1)) / (np.sqrt(v[k] / (1 - B2)) + 1e-8)
        worst, size = max(worst, abs((wa[k] - wc[k]) - want).max()), max(size, abs(want).max())
    check(size > 0 and worst <= 1e-4 * size, f"C's biases moved by Adam at step 1 with lr {lr5} (worst {worst:.2e} of {size:.2e})")
p = c.run([a.tool, "verify", os.path.join(d["C"], "iter_0000005.h5")], want=None)
check(p.returncode == 0, f"hpct_ckpt verify passes on C (negative step base in the checksum; rc {p.returncode})")
# Requeued after the fresh start: C continues from its own moments (bias correction at step 2),
# as one straight run with --no-load-optim at the same point does.
shutil.rmtree(os.path.join(a.workdir, "E"), ignore_errors=True)
d["E"] = os.path.join(a.workdir, "E")
shutil.copytree(d["A"], d["E"])
c.run([a.gpt, *model, "--train-iters", "6", "--load", d["C"], "--save", d["C"]])
c.run([a.gpt, *model, "--train-iters", "6", "--load", d["E"], "--save", d["E"], "--no-load-optim"])
with ckpt("C", 6) as f1, ckpt("E", 6) as f2:
    w1, w2 = tensors(f1, "model"), tensors(f2, "model")
    check(all((w1[k] == w2[k]).all() for k in w1) and int(f1.attrs["optimizer_step_base"]) == -4,
          "C resumed to 6 equals a straight --no-load-optim run from A to 6, bitwise (the step base kept)")
c.one_line_error("--no-load-optim with --finetune-resume-optimizer",
                 c.run(ft + ["--train-iters", "1", "--finetune-resume-optimizer", "--no-load-optim"], want=None),
                 "pretrain_gpt", ["--no-load-optim", "--finetune-resume-optimizer"])

c.one_line_error("--finetune-resume-optimizer without --finetune",
                 c.run([a.gpt, *model, "--train-iters", "1", "--load", d["A"], "--finetune-resume-optimizer"], want=None),
                 "pretrain_gpt", ["--finetune-resume-optimizer goes with --finetune"])
c.finish()
