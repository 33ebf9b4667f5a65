#!/usr/bin/env python3
"""pretrain_gpt --device cuda (ZeRO-Offload) as a user runs it.

--mode refused: where no GPU can be used (no /proc/driver/nvidia/gpus entry, or a CPU-only build),
  --device cuda stops before step 1 with one line naming the CUDA backend and why. On a GPU
  machine this mode prints "[  SKIPPED ]" (CTest reports it as skipped).
--mode train: on a GPU machine, 4 iterations of the tiny GPT at ZeRO stage 2 with the optimizer
  offloaded to the host, on the CPU backend and on the GPU: the losses agree within 1e-3 (fp32; the
  GPU sums in another order), and the JSON summary reports the device tier (fp32 parameters and
  gradient sum, 4+4 bytes per parameter, with the gradients of the blocks in use; the activations;
  and 4 bytes per parameter copied each way per step); then the same with 4 micro-steps per step,
  whose gradients are summed on the GPU and cross once per step; then bf16, where 2 bytes per
  parameter go each way per step. Without a GPU it prints "[  SKIPPED ]".
--mode tp: on a GPU machine, 2 ranks (sharing the GPU or not) at --tensor-model-parallel-size 2, with
  and without --sequence-parallel, on the CPU backend and on the GPU: the losses agree within 1e-3
  and the tensor-parallel bytes per step are equal (the GPU stages the same collectives through the
  host). Without a GPU it prints "[  SKIPPED ]".

cuda_offload_check.py --mode refused|train|tp --gpt BIN --args FILE --workdir DIR [--mpi "MPIEXEC -n 2 ..."]
"""
import argparse
import json
import os
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["refused", "train", "tp"], required=True)
ap.add_argument("--mpi", default="")
ap.add_argument("--gpt", required=True)
ap.add_argument("--args", required=True)
ap.add_argument("--workdir", required=True)
a = ap.parse_args()
os.makedirs(a.workdir, exist_ok=True)
gpus = os.listdir("/proc/driver/nvidia/gpus") if os.path.isdir("/proc/driver/nvidia/gpus") else []

cfg = os.path.join(a.workdir, "offload_cpu.ds.json")
with open(cfg, "w") as f:
    json.dump({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e5, "offload_optimizer": {"device": "cpu"}}}, f)


def run(name, device, extra=(), gbs=2, prefix=()):
    out = os.path.join(a.workdir, name + ".json")
    metrics = os.path.join(a.workdir, name + ".metrics.jsonl")
    for f in (out, metrics):
        if os.path.exists(f):
            os.remove(f)
    cmd = [*prefix, a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--train-iters", "4", "--log-interval", "1",
           "--eval-iters", "0", "--micro-batch-size", "2", "--global-batch-size", str(gbs), "--deepspeed_config", cfg,
           "--device", device, "--json", out, "--metrics-file", metrics, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or not os.path.exists(out):
        return p, None
    j = json.load(open(out))
    j["losses"] = [r["lm_loss"] for r in map(json.loads, open(metrics)) if r.get("type") == "train"]
    return p, j


if a.mode == "refused":
    if gpus:
        print("[  SKIPPED ] a GPU is here (pretrain_gpt_device_cuda_offload runs instead)")
        sys.exit(0)
    p, _ = run("refused", "cuda")
    errs = [l for l in (p.stdout + p.stderr).splitlines() if "error" in l]
    print("\n".join(errs))
    ok = p.returncode == 1 and len(errs) == 1 and re.search(r"pretrain_gpt: error: .*CUDA backend: \S", errs[0])
    ok = ok and "iteration" not in p.stdout
    print("ok   refused before step 1 with one line" if ok else "FAIL expected exit 1 and one 'CUDA backend:' line")
    sys.exit(0 if ok else 1)

if not gpus:
    print("[  SKIPPED ] no GPU (/proc/driver/nvidia/gpus has no entry)")
    sys.exit(0)
fails = []
if a.mode == "tp":
    for sp in ([], ["--sequence-parallel"]):
        name = "tp2" + ("_sp" if sp else "")
        extra = ["--tensor-model-parallel-size", "2", *sp]
        pc, c = run(name + "_cpu", "cpu", extra, prefix=a.mpi.split())
        pg, g = run(name + "_cuda", "cuda", extra, prefix=a.mpi.split())
        if c is None or g is None:
            print((pc.stdout + pc.stderr + pg.stdout + pg.stderr)[-3000:])
            fails.append(f"{name}: a run did not finish")
            continue
        if len(c["losses"]) != 4 or len(g["losses"]) != 4:
            fails.append(f"{name}: expected 4 logged iterations, got {len(c['losses'])} and {len(g['losses'])}")
        for i, (x, y) in enumerate(zip(c["losses"], g["losses"])):
            if abs(x - y) > 1e-3 * abs(x):
                fails.append(f"{name} loss {i}: cpu {x} vs cuda {y}")
        bc = c["tensor_parallel"]["allreduce_bytes_per_step_per_rank"]
        bg = g["tensor_parallel"]["allreduce_bytes_per_step_per_rank"]
        if bc != bg or not bc[0] > 0:
            fails.append(f"{name}: tensor-parallel bytes per step cpu {bc} vs cuda {bg}")
        print(f"{name}: losses cpu {c['losses']} cuda {g['losses']}; tp bytes/step {bg}")
    for f in fails:
        print("FAIL " + f)
    sys.exit(1 if fails else 0)
pc, cpu = run("cpu", "cpu")
pg, gpu = run("cuda", "cuda")
for name, p, j in (("cpu", pc, cpu), ("cuda", pg, gpu)):
    if j is None:
        print((p.stdout + p.stderr)[-3000:])
        fails.append(f"{name}: exit {p.returncode}")
if not fails:
    lc, lg = cpu["losses"], gpu["losses"]
    if len(lc) != 4 or len(lg) != 4:
        fails.append(f"expected 4 logged iterations, got {len(lc)} and {len(lg)}")
    for i, (x, y) in enumerate(zip(lc, lg)):
        if abs(x - y) > 1e-3 * abs(x):
            fails.append(f"loss {i}: cpu {x} vs cuda {y}")
    P = gpu["parameters"]
    dev = gpu["memory_per_rank"]["device"]
    # fp32 at stage 2: the parameters and the gradient sum resident (4 + 4 bytes each) and the
    # gradients of the blocks in use (test_zero checks the exact figure on the CPU route).
    if dev is None or not 8 * P < dev["parameters_and_gradients"][0] < 12 * P:
        fails.append(f"device tier: {dev}, expected parameters_and_gradients between 8 and 12 x {P}")
    elif not dev["activations"][0] > 0:
        fails.append("device tier: no activations reported")
    # Stage 2 keeps the device copy for the step: one upload of the fp32 parameters per step, one
    # download of each micro-step's gradients (one micro-step here).
    elif dev["parameter_bytes_to_device_per_step"][0] != 4 * P or dev["gradient_bytes_to_host_per_step"][0] != 4 * P:
        fails.append(f"copies per step: {dev['parameter_bytes_to_device_per_step']} to the GPU, "
                     f"{dev['gradient_bytes_to_host_per_step']} back; expected 4 x {P} each")
    if cpu["memory_per_rank"]["device"] is not None:
        fails.append("the CPU run reports a device tier")
    print(f"losses cpu {lc} cuda {lg}")
# 4 micro-steps per step: the GPU sums them and hands the sum over once per step.
pa, ga = run("cuda_accum", "cuda", gbs=8)
pca, ca = run("cpu_accum", "cpu", gbs=8)
if ga is None or ca is None:
    print((pa.stdout + pa.stderr + pca.stdout + pca.stderr)[-3000:])
    fails.append("runs with 4 micro-steps did not finish")
else:
    P = ga["parameters"]
    dev = ga["memory_per_rank"]["device"]
    if dev["gradient_bytes_to_host_per_step"][0] != 4 * P:
        fails.append(f"4 micro-steps: {dev['gradient_bytes_to_host_per_step']} gradient bytes back per step, "
                     f"expected 4 x {P} (once per step)")
    for i, (x, y) in enumerate(zip(ca["losses"], ga["losses"])):
        if abs(x - y) > 1e-3 * abs(x):
            fails.append(f"4 micro-steps, loss {i}: cpu {x} vs cuda {y}")
    print(f"4 micro-steps: losses cpu {ca['losses']} cuda {ga['losses']}")
# bf16: the GPU keeps the engine's 16-bit parameters (2 bytes each, copied once per step) and widens
# a block to fp32 only while in use; the 16-bit gradient sum comes back once per step. The
# materialised attention (--attention-kernel plain): its dropout mask is the CPU's.
pb, gb = run("cuda_bf16", "cuda", ["--bf16", "--attention-kernel", "plain"])
pcb, cb = run("cpu_bf16", "cpu", ["--bf16", "--attention-kernel", "plain"])
if gb is None or cb is None:
    print((pb.stdout + pb.stderr + pcb.stdout + pcb.stderr)[-3000:])
    fails.append("bf16 runs did not finish")
else:
    P = gb["parameters"]
    dev = gb["memory_per_rank"]["device"]
    if dev["parameter_bytes_to_device_per_step"][0] != 2 * P or dev["gradient_bytes_to_host_per_step"][0] != 2 * P:
        fails.append(f"bf16 copies per step: {dev['parameter_bytes_to_device_per_step']} in, "
                     f"{dev['gradient_bytes_to_host_per_step']} back; expected 2 x {P} each")
    fp32_peak = gpu["memory_per_rank"]["device"]["parameters_and_gradients"][0] if gpu else float("inf")
    if not 4 * P < dev["parameters_and_gradients"][0] < fp32_peak:
        fails.append(f"bf16 device peak {dev['parameters_and_gradients']}: expected above 4 x {P} "
                     f"and below the fp32 run's {fp32_peak}")
    for i, (x, y) in enumerate(zip(cb["losses"], gb["losses"])):
        if abs(x - y) > 1e-2 * abs(x):
            fails.append(f"bf16 loss {i}: cpu {x} vs cuda {y}")
for f in fails:
    print("FAIL " + f)
sys.exit(1 if fails else 0)
