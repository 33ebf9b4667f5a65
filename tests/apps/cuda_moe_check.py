"""pretrain_moe --device cuda (ZeRO-Offload) gives the CPU backend's losses, at EP 1, EP 2 and TED.

A tiny MoE (8 experts on every other layer, top-2 with token dropping, Random Token Selection,
Jitter router noise, aux and z losses) trains 4 steps at ZeRO stage 2 with the optimizer on the
host: on the CPU backend (1 rank, the reference), on the GPU (1 rank), and with expert parallelism
2 on 2 ranks sharing the GPU (the all-to-all stages the rows through host memory), and TED on 4 ranks
(tensor parallel 2 x expert parallel 2, duplicate token dropping; every collective staged). Each step's lm
loss and moe loss must equal the reference within 1e-3 relative (fp32: cuBLAS and the CPU sum in
other orders, as in pretrain_gpt_device_cuda_offload; a routing decision flipped by that rounding
would move the loss by more), the EP 2 and TED runs' all-to-all bytes must equal those of the same layout
on the CPU (the same routes crossed), and tokens must be dropped. Without a GPU it prints
"[  SKIPPED ]" (CTest reports the test as skipped).
"""
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

gpus = os.listdir("/proc/driver/nvidia/gpus") if os.path.isdir("/proc/driver/nvidia/gpus") else []
if not gpus:
    print("[  SKIPPED ] no GPU (/proc/driver/nvidia/gpus has no entry)")
    sys.exit(0)
c = Checks("--moe", "--mpi", "--workdir")
a = c.args
cfg = os.path.join(a.workdir, "offload.ds.json")
with open(cfg, "w") as f:
    json.dump({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e5, "offload_optimizer": {"device": "cpu"}}}, f)
base = ["--mock-data", "--vocab-size", "512", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "4", "--lr", "2e-3",
        "--log-interval", "1", "--eval-iters", "0", "--num-experts", "8", "--expert-interval", "2", "--topk", "2",
        "--moe-train-capacity-factor", "0.75", "--moe-min-capacity", "1", "--moe-loss-coeff", "0.01",
        "--moe-z-loss-coeff", "0.001", "--moe-noisy-gate-policy", "Jitter", "--seed", "7", "--deepspeed_config", cfg]
mpi = shlex.split(a.mpi)  # "mpirun -np 2 ...": the count is replaced per run


def run(tag, np, ep, device, extra=()):
    mf, js = os.path.join(a.workdir, tag + ".jsonl"), os.path.join(a.workdir, tag + ".json")
    cmd = mpi[:2] + [str(np)] + mpi[3:] + [a.moe] + base + ["--moe-expert-parallel-size", str(ep), "--device", device,
                                                           "--metrics-file", mf, "--json", js, *extra]
    p = c.run(cmd)
    if p.returncode != 0:
        return [], {}
    steps = [json.loads(l) for l in open(mf)]
    return [s for s in steps if s.get("type") == "train"], json.load(open(js))


def close(x, y, rel=1e-3):
    return abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)


ref, _ = run("cpu_ep1", 1, 1, "cpu")
c.check(len(ref) == 4, "CPU reference: 4 logged steps")
dropped = sum(l["dropped_fraction"] for s in ref for l in s["moe_layers"])
c.check(dropped > 0, f"tokens are dropped: mean dropped fraction {dropped / max(1, 2 * len(ref)):.3f}")
_, cpu2 = run("cpu_ep2", 2, 2, "cpu")
ted = ["--tensor-model-parallel-size", "2"]
_, cpu_ted = run("cpu_ted", 4, 2, "cpu", ted)
for tag, np, ep, extra, same in (("cuda_ep1", 1, 1, [], None), ("cuda_ep2", 2, 2, [], cpu2),
                                 ("cuda_ted", 4, 2, ted, cpu_ted)):
    got, summary = run(tag, np, ep, "cuda", extra)
    ok = len(got) == len(ref) == 4
    worst = 0.0
    for r, g in zip(ref, got):
        for k in ("lm_loss", "moe_loss"):
            worst = max(worst, abs(r[k] - g[k]) / max(abs(r[k]), 1e-12))
            ok = ok and close(r[k], g[k])
    losses = [round(s["lm_loss"], 6) for s in got]
    c.check(ok, f"{tag}: lm and moe losses of the CPU run within 1e-3 (worst {worst:.2e}; lm {losses})")
    if same is not None:
        key = "alltoall_bytes_per_step_per_rank"
        got_b, want_b = summary.get("moe", {}).get(key), same.get("moe", {}).get(key)
        c.check(got_b is not None and got_b == want_b, f"{tag}: all-to-all bytes per step {got_b} = the CPU's {want_b}")
c.finish()
