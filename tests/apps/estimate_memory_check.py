#!/usr/bin/env python3
"""Runs `pretrain_gpt --estimate-memory` on a model args file and checks its --json against the
ZeRO formulas (docs/zero.md) and the fit verdicts for two cluster shapes.

estimate_memory_check.py --gpt PRETRAIN_GPT --args inputs/gpt-175b.args --workdir DIR [--mpi "mpiexec -n 2 ..."]

Cluster A (8 nodes x 8 GPUs of 80 GB, 1000 GB CPU per node, no NVMe): for 175B in 16-bit training,
stage 3 fits and stages 0-2 do not. Cluster B (the same on 1 node, 30 TB NVMe): stage 3 no longer
fits on the device, parameter + optimizer offload to NVMe does."""
import argparse
import json
import os
import shlex
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--gpt", required=True)
ap.add_argument("--args", required=True)
ap.add_argument("--workdir", required=True)
ap.add_argument("--mpi", default="")
a = ap.parse_args()
os.makedirs(a.workdir, exist_ok=True)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(name, extra):
    out = os.path.join(a.workdir, name + ".json")
    if os.path.exists(out):
        os.remove(out)
    cmd = shlex.split(a.mpi) + [a.gpt, "@" + a.args, "--estimate-memory", "--json", out] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print("$", " ".join(cmd))
    print(p.stdout[-4000:])
    if p.returncode != 0:
        print(f"FAIL: exit code {p.returncode}")
        sys.exit(1)
    check(p.stdout.count("# tool:") == 1, f"{name}: the table is printed once (rank 0 only)")
    with open(out) as f:
        return json.load(f), p.stdout


def psi_of(m):
    C, L, T, Vp = m["hidden_size"], m["num_layers"], m["seq_length"], m["padded_vocab_size"]
    return Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def check_formulas(doc, name):
    m, prec, c = doc["model"], doc["precision"], doc["cluster"]
    psi = m["params"]
    check(psi == psi_of(m), f"{name}: Ψ {psi} != count from the shape {psi_of(m)}")
    p, g, k = prec["param_bytes"], prec["grad_bytes"], prec["optimizer_bytes"]
    want = (2, 2, 12) if prec["name"] == "mixed" else (4, 4, 8)
    check((p, g, k) == want, f"{name}: bytes per parameter {(p, g, k)} != {want}")
    N = c["devices"]
    part = -(-psi // N)
    # Offload: 12 bytes of fp32 optimizer arrays + a 4-byte fp32 gradient per partitioned parameter;
    # NVMe takes the 12, the gradient stays on the host; parameter offload adds the 16-bit copy (mixed).
    opt, grad = 12, 4
    par = 2 if prec["name"] == "mixed" else 0
    expect = {
        (0, "none"): (p + g + k) * psi,
        (1, "none"): (p + g) * psi + (g + k) * part,  # + the reduced gradient partition the optimizer reads
        (2, "none"): p * psi + (g + k) * part,
        (3, "none"): (p + g + k) * part,
        (1, "optimizer:cpu"): (p + g) * psi,
        # On GPUs ZeRO-Offload's device store keeps the step's gradient sum at stage 2 too.
        (2, "optimizer:cpu"): (p + g) * psi if not c["devices_in_host_memory"] else p * psi,
        (3, "optimizer:cpu"): p * part,
        (3, "optimizer:nvme"): p * part,
        (3, "optimizer+param:cpu"): 0,
        (3, "optimizer+param:nvme"): 0,
    }
    seen = set()
    for r in doc["plans"]:
        key = (r["stage"], r["offload"])
        seen.add(key)
        check(key in expect, f"{name}: unexpected plan {key}")
        if key not in expect:
            continue
        check(r["device_states"] == expect[key], f"{name}: {key} device states {r['device_states']} != {expect[key]}")
        check(r["device_total"] == r["device_states"] + r["device_buffers"], f"{name}: {key} device total")
        gpn = c["devices_per_node"]
        host_states, nvme = {
            "none": (0, 0),
            "optimizer:cpu": ((opt + grad) * part, 0),
            "optimizer:nvme": (grad * part, opt * part),
            "optimizer+param:cpu": ((opt + grad + par) * part, 0),
            "optimizer+param:nvme": (grad * part, (opt + par) * part),
        }[key[1]]
        check(r["host_states_per_rank"] == host_states, f"{name}: {key} host states {r['host_states_per_rank']} != {host_states}")
        check(r["nvme_per_rank"] == nvme, f"{name}: {key} nvme {r['nvme_per_rank']} != {nvme}")
        check(r["nvme_per_node"] == gpn * r["nvme_per_rank"], f"{name}: {key} nvme per node")
        host = gpn * (r["host_states_per_rank"] + r["host_buffers_per_rank"])
        if c["devices_in_host_memory"]:
            host += gpn * r["device_total"]
        check(r["host_per_node"] == host, f"{name}: {key} host per node")
        fd = c["devices_in_host_memory"] or r["device_total"] <= c["device_bytes"]
        check(r["fits_device"] == fd and r["fits_host"] == (host <= c["host_bytes_per_node"])
              and r["fits_nvme"] == (r["nvme_per_node"] <= c["nvme_bytes_per_node"])
              and r["fits"] == (r["fits_device"] and r["fits_host"] and r["fits_nvme"]), f"{name}: {key} fit verdicts")
    check(seen == set(expect), f"{name}: plans {sorted(seen)} != {sorted(expect)}")


def fits(doc):
    return {(r["stage"], r["offload"]): r["fits"] for r in doc["plans"]}


shape_a = ["--estimate-nodes", "8", "--estimate-gpus-per-node", "8", "--estimate-gpu-memory", "80",
           "--estimate-cpu-memory", "1000", "--estimate-nvme", "0"]
doc, out = run("mixed_8x8", ["--bf16"] + shape_a)
check_formulas(doc, "mixed_8x8")
check(abs(doc["model"]["params"] / 1e9 - 174.6) < 0.1, f"175B args give Ψ = {doc['model']['params']}")
check(doc["model"]["padded_vocab_size"] == 50304, "GPT-2 vocabulary padded to 50304 when --vocab-size is not given")
f = fits(doc)
check(f[(3, "none")] and not f[(2, "none")] and not f[(1, "none")] and not f[(0, "none")],
      f"8x8x80GB: only stage 3 fits without offload: {f}")
check(not f[(3, "optimizer:nvme")], "no NVMe given: NVMe offload cannot fit")
# The ZeRO paper's stage-1 figure, scaled: (2+2)Ψ + 12Ψ/64 on each device, plus the reduced 16-bit
# gradient partition the engine holds for the optimizer (2Ψ/64).
r1 = [r for r in doc["plans"] if r["stage"] == 1 and r["offload"] == "none"][0]
check(abs(r1["device_states"] / 1e9 - (4 * 174.604836864 + 14 * 174.604836864 / 64)) < 0.01, "stage 1 GB")
ds = [r for r in doc["plans"] if r["stage"] == 3 and r["offload"] == "none"][0]["deepspeed_estimate"]
check(ds is not None and abs(ds["device"] - (4 * doc["model"]["largest_block_params"] + 18 * doc["model"]["params"] / 64)) < 1,
      "DeepSpeed's ZeRO-3 estimate shown beside ours")

doc, out = run("mixed_1x8", ["--bf16"] + shape_a[:1] + ["1"] + shape_a[2:-1] + ["30000"])
check_formulas(doc, "mixed_1x8")
f = fits(doc)
check(not f[(3, "none")] and not f[(3, "optimizer+param:cpu")] and f[(3, "optimizer+param:nvme")],
      f"1x8x80GB + 30 TB NVMe: only offload to NVMe fits: {f}")

doc, out = run("fp32_8x8", shape_a)
check_formulas(doc, "fp32_8x8")
check(doc["precision"]["name"] == "fp32", "no --bf16/--fp16: fp32 states (4+4+8)")

# Defaults: this machine (1 node, 2 host ranks, MemTotal, free disk).
doc, out = run("defaults", [])
check_formulas(doc, "defaults")
check(doc["cluster"]["nodes"] == 1 and doc["cluster"]["devices_per_node"] == 2 and doc["cluster"]["devices_in_host_memory"],
      "default cluster is this machine")
check(doc["cluster"]["host_bytes_per_node"] > 0, "host memory read from /proc/meminfo")

print(f"{len(failures)} failures" if failures else "all estimate checks passed")
sys.exit(1 if failures else 0)
