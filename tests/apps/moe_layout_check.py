"""pretrain_moe on every layout gives the single-rank losses, and a checkpoint moves between layouts.

A tiny MoE (inputs/moe-tiny.args made smaller) with token dropping and Random Token Selection on
(capacity factor 0.5, so tokens are dropped every step) runs 4 steps on 1 rank, then on
(ranks, EP, ZeRO) = (2,1,0) (2,2,1) (2,2,3) (4,2,2) (4,4,0) (4,4,3); each run's per-step lm loss, moe
loss and grad norm must equal the single-rank run's within 1e-5 relative (the tensor-parallel
tolerance). Why a tolerance and not bitwise: with EP > 1 an expert's GEMM takes the rows of several
ranks' micro-batches at once, and gradients are summed in another order (~1e-9 relative at step 1).
Adam's first step then moves every weight by about lr whatever the size of its gradient, so a weight
whose gradient is rounding noise moves either way: residual MoE with Jitter on (2,2,1) showed 1.05e-6
on the step-2 grad norm (2026-11-27, Debian's packages of that day), shrinking after; with
--adam-eps 1e-5, which damps steps on noise-sized gradients, the same pair differs by 2.3e-8. 1e-5
still catches any routing or reduction error, which moves losses by >1e-4.
Top-2 without token dropping and residual MoE with Jitter are compared the same way on (2,2,1) and
(4,4,2); TED's T=2 x E=2 on 4 ranks with and without duplicate token dropping too (and the two
against each other exactly, with their all-to-all bytes); the TED runs' model states per rank against
--estimate-memory's plan for the same shape, byte for byte (ZeRO 1, 2 and 3). Then a run saved at iteration 2 on (2 ranks, EP 2) resumes at EP 1 (1 rank) and EP 4 (4 ranks); its
iterations 3-4 must match the uninterrupted run; --finetune from it (weights only) gives equal
losses on 1 rank and at EP 2, and refuses other experts than the weights'. Also: the bad-flag
errors name their flag.
"""
import json
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--moe", "--mpi", "--workdir")
a = c.args
base = ["--mock-data", "--vocab-size", "512", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--lr", "2e-3",
        "--log-interval", "1", "--eval-iters", "0", "--num-experts", "4", "--expert-interval", "2",
        "--moe-train-capacity-factor", "0.5", "--moe-min-capacity", "1", "--moe-loss-coeff", "0.01", "--seed", "7"]
mpi = shlex.split(a.mpi)  # "mpirun -np 2 ..." : the count is replaced per run


def run(np, ep, zero, extra=(), tag=None):
    tag = tag or f"n{np}_ep{ep}_z{zero}"
    mf = os.path.join(a.workdir, tag + ".jsonl")
    cmd = mpi[:2] + [str(np)] + mpi[3:] + [a.moe] + base + ["--moe-expert-parallel-size", str(ep), "--zero-stage", str(zero),
                                                           "--metrics-file", mf] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        return p.returncode, []
    steps = [json.loads(l) for l in open(mf)]
    return 0, [s for s in steps if s.get("type") == "train"]


def close(x, y, rel=1e-5):
    return abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)


rc, ref = run(1, 1, 0)
c.check(rc == 0 and len(ref) == 4, "single-rank reference run")
dropped = sum(l["dropped_fraction"] for s in ref for l in s["moe_layers"])
c.check(dropped > 0, f"tokens are dropped (capacity factor 0.5): mean dropped fraction {dropped / 8:.3f}")
for np, ep, zero in [(2, 1, 0), (2, 2, 1), (2, 2, 3), (4, 2, 2), (4, 4, 0), (4, 4, 3)]:
    rc, got = run(np, ep, zero)
    ok = rc == 0 and len(got) == len(ref)
    worst = 0.0
    if ok:
        for r, g in zip(ref, got):
            for k in ("lm_loss", "moe_loss", "grad_norm"):
                worst = max(worst, abs(r[k] - g[k]) / max(abs(r[k]), 1e-12))
                ok = ok and close(r[k], g[k])
            ok = ok and [l["load"] for l in r["moe_layers"]] == [l["load"] for l in g["moe_layers"]]
    c.check(ok, f"{np} ranks, EP {ep}, ZeRO {zero}: losses, grad norms and expert loads equal the single-rank run "
                f"(worst relative difference {worst:.1e})")

# Other gates: top-2 without dropping (capacity = the largest demand, agreed over the EP group), and
# residual MoE with jittered router input; each against its own single-rank run.
for name, extra in [("top-2, no token dropping", ["--topk", "2", "--disable-moe-token-dropping"]),
                    ("residual MoE, Jitter", ["--mlp-type", "residual", "--moe-noisy-gate-policy", "Jitter"])]:
    tag = name.split(",")[0].replace(" ", "_")
    rc, vref = run(1, 1, 0, extra, tag=tag + "_ref")
    ok = rc == 0 and len(vref) == 4
    if "no token" in name:
        c.check(ok and all(l["dropped_fraction"] == 0 for s in vref for l in s["moe_layers"]), f"{name}: nothing dropped")
    for np, ep, zero in [(2, 2, 1), (4, 4, 2)]:
        rc, got = run(np, ep, zero, extra, tag=f"{tag}_n{np}_ep{ep}")
        good = ok and rc == 0 and len(got) == len(vref) and all(
            close(r[k], g[k]) for r, g in zip(vref, got) for k in ("lm_loss", "moe_loss", "grad_norm"))
        c.check(good, f"{name}: {np} ranks, EP {ep}, ZeRO {zero} equal the single-rank run")

# TED: tensor x expert parallelism (T=2 x E=2 on 4 ranks) with duplicate token dropping (default)
# and without; both equal the single-rank run, and each other exactly (it moves rows, not
# arithmetic). Bytes from the summaries: the two tensor-parallel ranks of a pair send, together,
# the rows one of them sends without it; the counts exchange ((E-1) x El ints per MoE layer and
# micro-batch: 2 layers x 2 micro-batches per step here) is the same for both.
ted = {}
for dtd in (True, False):
    tag = "ted" if dtd else "ted_nodtd"
    js = os.path.join(a.workdir, tag + ".json")
    extra = ["--tensor-model-parallel-size", "2", "--json", js] + ([] if dtd else ["--disable-duplicate-token-dropping"])
    rc, got = run(4, 2, 1, extra, tag=tag)
    ok = rc == 0 and len(got) == len(ref) and all(close(r[k], g[k]) for r, g in zip(ref, got)
                                                  for k in ("lm_loss", "moe_loss", "grad_norm"))
    c.check(ok, f"T=2 x E=2 x D=1 {'with' if dtd else 'without'} duplicate token dropping equals the single-rank run")
    ted[dtd] = (got, json.load(open(js)) if rc == 0 else {})
# ZeRO 3 with every block partitioned (the planner does not model stage3_param_persistence_threshold,
# under which this small model's blocks would all stay whole).
z3 = os.path.join(a.workdir, "zero3_partition_all.json")
with open(z3, "w") as f:
    json.dump({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}, f)
etp = ["--tensor-model-parallel-size", "2", "--enable-expert-tensor-parallelism"]
rc, got = run(4, 2, 3, etp + ["--deepspeed_config", z3, "--json", os.path.join(a.workdir, "ted_etp.json")], tag="ted_etp")
c.check(rc == 0 and len(got) == len(ref) and all(close(r[k], g[k]) for r, g in zip(ref, got)
                                                 for k in ("lm_loss", "moe_loss", "grad_norm")),
        "T=2 x E=2 with experts split over the tensor-parallel group, ZeRO 3, equals the single-rank run")
rc, got = run(8, 2, 2, etp + ["--json", os.path.join(a.workdir, "ted8.json")], tag="ted8")
c.check(rc == 0 and len(got) == len(ref) and all(close(r[k], g[k]) for r, g in zip(ref, got)
                                                 for k in ("lm_loss", "moe_loss", "grad_norm")),
        "8 ranks, T=2 x E=2 x D=2 with split experts, ZeRO 2, equals the single-rank run")


# --estimate-memory on the same shape and grid plans what each TED run then holds: parameters,
# gradients and optimizer states per rank, byte for byte (every rank of these grids holds the same).
def held_as_planned(tag, np, stage, extra):
    est = os.path.join(a.workdir, tag + "_plan.json")
    p = subprocess.run([a.moe] + base + ["--moe-expert-parallel-size", "2", "--estimate-memory",
                                         "--estimate-gpus-per-node", str(np), "--json", est] + extra,
                       capture_output=True, text=True, timeout=300)
    js = os.path.join(a.workdir, tag + ".json")
    if p.returncode != 0 or not os.path.exists(js):
        c.check(False, f"{tag}: plan exit {p.returncode} {(p.stdout + p.stderr)[-300:]}, or no run summary")
        return
    want = {(q["stage"], q["offload"]): q["device_states"] for q in json.load(open(est))["plans"]}[(stage, "none")]
    h = json.load(open(js))["memory_per_rank"]["host"]
    held = [x + y + z for x, y, z in zip(h["parameters"], h["gradients"], h["optimizer_states"])]
    c.check(len(held) == np and all(v == want for v in held),
            f"{tag}: ZeRO {stage} on {np} ranks held {held} bytes of model states per rank, the plan says {want}")


held_as_planned("ted", 4, 1, ["--tensor-model-parallel-size", "2"])
held_as_planned("ted_etp", 4, 3, etp)
held_as_planned("ted8", 8, 2, etp)
rc, got = run(8, 2, 1, ["--tensor-model-parallel-size", "4", "--enable-expert-tensor-parallelism"], tag="ted8_t4")
c.check(rc == 0 and len(got) == len(ref) and all(close(r[k], g[k]) for r, g in zip(ref, got)
                                                 for k in ("lm_loss", "moe_loss", "grad_norm")),
        "8 ranks, T=4 x E=2 with split experts and dropping 4 ways, ZeRO 1, equals the single-rank run")
(on, son), (off, soff) = ted[True], ted[False]
c.check(son.get("moe", {}).get("duplicate_token_dropping") is True and soff.get("moe", {}).get("duplicate_token_dropping") is False,
        "the summary says whether duplicate token dropping ran")
c.check(len(on) == 4 and [g["lm_loss"] for g in on] == [g["lm_loss"] for g in off] and
        [g["grad_norm"] for g in on] == [g["grad_norm"] for g in off], "duplicate token dropping changes no loss or gradient norm")
if son and soff:
    a_on, a_off = son["moe"]["alltoall_bytes_per_step_per_rank"], soff["moe"]["alltoall_bytes_per_step_per_rank"]
    counts = 2 * 2 * (2 - 1) * 2 * 4
    pairs = [(0, 1), (2, 3)]
    c.check(all((a_on[i] - counts) + (a_on[j] - counts) == a_off[i] - counts == a_off[j] - counts for i, j in pairs),
            f"all-to-all bytes per step: with dropping {a_on}, without {a_off}; each tensor-parallel pair's sum equals one rank's")
    g_on = son["moe"]["tp_bytes_per_step_per_rank"]
    c.check(all(v > 0 for v in g_on) and soff["moe"]["tp_bytes_per_step_per_rank"] == [0, 0, 0, 0],
            f"only duplicate token dropping gathers over the tensor-parallel group ({g_on} bytes per step)")

# Checkpoints across EP: save at iteration 2 on 2 ranks with EP 2, resume elsewhere.
ck = os.path.join(a.workdir, "ckpt")
rc, _ = run(2, 2, 1, ["--save", ck, "--exit-interval", "2"], tag="save_ep2")
c.check(rc == 0 and os.path.exists(os.path.join(ck, "latest")), "EP 2 run saved at iteration 2")
for np, ep, zero in [(1, 1, 0), (4, 4, 2)]:
    rc, got = run(np, ep, zero, ["--load", ck], tag=f"resume_n{np}_ep{ep}")
    ok = rc == 0 and [s["iteration"] for s in got] == [3, 4]
    if ok:
        for g in got:
            r = ref[g["iteration"] - 1]
            ok = ok and close(r["lm_loss"], g["lm_loss"]) and close(r["grad_norm"], g["grad_norm"])
    c.check(ok, f"the EP 2 checkpoint resumes on {np} ranks at EP {ep}, ZeRO {zero}: iterations 3-4 match the uninterrupted run")

# Starting from the checkpoint's weights (--finetune: iteration 0, fresh optimizer) on 1 rank and
# on 2 ranks with EP 2: the same losses (the layout tolerance), and not those of a fresh start.
fts = {}
for np, ep, zero in [(1, 1, 0), (2, 2, 1)]:
    rc, fts[ep] = run(np, ep, zero, ["--finetune", "--load", ck], tag=f"finetune_n{np}_ep{ep}")
f1, f2 = fts[1], fts[2]
ok = [s["iteration"] for s in f1] == [1, 2, 3, 4] == [s["iteration"] for s in f2]
ok = ok and all(close(x["lm_loss"], y["lm_loss"]) and close(x["moe_loss"], y["moe_loss"]) for x, y in zip(f1, f2))
c.check(ok, "--finetune from the EP 2 checkpoint: iterations 1-4 on 1 rank equal those on 2 ranks at EP 2")
c.check(bool(f1) and abs(f1[0]["lm_loss"] - ref[0]["lm_loss"]) > 1e-2,
        f"--finetune starts from the trained weights: first loss {f1[0]['lm_loss'] if f1 else None:.4f}, "
        f"a fresh start's {ref[0]['lm_loss']:.4f}")
other = list(base)
other[other.index("--num-experts") + 1] = "8"
p = subprocess.run(mpi[:2] + ["1"] + mpi[3:] + [a.moe] + other + ["--finetune", "--load", ck], capture_output=True,
                   text=True, timeout=300)
lines = [l for l in p.stderr.splitlines() if "error:" in l]
c.check(p.returncode == 1 and len(lines) == 1 and "--num-experts" in lines[0] and "4 in" in lines[0],
        f"--finetune with other experts than the weights': one error line naming --num-experts: {lines[:1]}")

# Bad input: one line naming the flag.
for extra, np, want in [(["--moe-expert-parallel-size", "3", "--global-batch-size", "6"], 3, "--moe-expert-parallel-size"),
                        (["--moe-expert-parallel-size", "2", "--global-batch-size", "6"], 3, "--moe-expert-parallel-size"),
                        (["--topk", "3"], 1, "--topk"),
                        (["--moe-train-capacity-factor", "0"], 1, "--moe-train-capacity-factor"),
                        (["--num-experts", "4", "8", "8"], 1, "--num-experts")]:
    cmd = mpi[:2] + [str(np)] + mpi[3:] + [a.moe] + base + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [l for l in p.stderr.splitlines() if "error:" in l]
    c.check(p.returncode == 1 and len(lines) == 1 and want in lines[0], f"{' '.join(extra)} on {np} ranks: one error line naming {want}: {lines[:1]}")
c.finish()
