#!/usr/bin/env bash
# ZeRO-Infinity on one machine: train a GPT whose model states (16 bytes per parameter: fp32
# parameters, gradients, Adam m and v) exceed this machine's RAM, with ZeRO stage 3 and the
# parameter shards and Adam moments on NVMe (each rank its own swap file), for a few steps. Then,
# on the same disk in the same run, nvme_bench measures sequential write and read bandwidth with
# the same aio settings, and the offload streams are compared with it.
#
#   bench/zero_infinity.sh [DIR] [ITERS] [LAYERS] [HIDDEN]    e.g. bench/zero_infinity.sh /tmp/zinf 3 32 2560
#
# Defaults: 32 layers x hidden 2560 with the mock data's 512-token vocabulary (Ψ = 2.52 B
# parameters, 40.3 GB of states), seq 128, micro batch 8 on each of 2 ranks (2048 tokens per step:
# with fewer, Adam's steps on a model this wide follow the noise and the loss does not fall),
# lr 1e-5, bf16 GEMMs (AMX). Each step's loss is measured on samples the model has not seen.
# Needs ~32 GB free in DIR and a build in ./build.
# Output: the run's log and JSON summary in DIR/, and a one-screen comparison at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/build/zero_infinity_scratch}
iters=${2:-4}
layers=${3:-32}
hidden=${4:-2560}
heads=$((hidden / 64))
np=2
bin="$root/build/apps/pretrain_gpt/pretrain_gpt"
nb="$root/build/apps/nvme_bench/nvme_bench"
[[ -x "$bin" && -x "$nb" ]] || { echo "build first (cmake --build build)" >&2; exit 1; }
mkdir -p "$dir/swap"
mpi=(mpirun --oversubscribe -np "$np")
[[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)

cat >"$dir/ds_config.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 1,
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "reduce_bucket_size": 1e8,
    "stage3_prefetch_bucket_size": 1e8,
    "stage3_param_persistence_threshold": 1e5,
    "stage3_max_live_parameters": 3e8,
    "sub_group_size": 1.6e7,
    "offload_optimizer": {"device": "nvme", "nvme_path": "$dir/swap", "buffer_count": 4},
    "offload_param": {"device": "nvme", "nvme_path": "$dir/swap"}
  },
  "aio": {"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 1, "single_submit": false, "overlap_events": true}
}
EOF

echo "# $(date -u +%FT%TZ) ZeRO-3 + NVMe offload: $layers layers, hidden $hidden, $np ranks, $iters steps; RAM $(awk '/MemTotal/ {printf "%.1f GiB", $2/2^20}' /proc/meminfo)"
"${mpi[@]}" "$bin" --num-layers "$layers" --hidden-size "$hidden" --num-attention-heads "$heads" --seq-length 128 \
  --mock-data --vocab-size 512 --global-batch-size $((8 * np)) --train-iters "$iters" --log-interval 1 --eval-iters 0 \
  --lr 1e-5 --min-lr 1e-5 --lr-warmup-iters 0 --lr-decay-style constant --checkpoint-activations \
  --deepspeed_config "$dir/ds_config.json" --json "$dir/summary.json" --metrics-file "$dir/metrics.jsonl" 2>&1 | tee "$dir/train.log"

# The same disk, same aio settings, per-rank files as large as each rank's swap file's largest array.
# One swap array's size per rank (the file holds three: fp32 parameters or, in bf16 runs, fp32
# masters, and Adam's m and v), the size nvme_bench writes and reads.
per_rank=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(int(max(j["memory_per_rank"]["nvme"]["file_bytes"]) / 3))' "$dir/summary.json")
echo "# nvme_bench on $dir/swap: write then read, ${np} ranks, $((per_rank >> 20)) MiB each, bs 1M, QD 32"
"${mpi[@]}" "$nb" --path "$dir/swap" --size "$((per_rank >> 20))M" --block-size 1M --queue-depth 32 --json "$dir/nvme_bench.json" 2>&1 | tail -6

python3 - "$dir/summary.json" "$dir/nvme_bench.json" "$dir/metrics.jsonl" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
def agg(mode):
    for c in b["cases"]:
        if c["mode"] == mode:
            return c["bandwidth_GBps"]
    raise SystemExit("nvme_bench has no %s case" % mode)
W, R = agg("write"), agg("read")
steps = s["iterations"] - s["start_iteration"]
o = s["nvme_offload"]
rss = s["peak_rss_bytes_per_rank"]
ram = [int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")][0]
nv = s["memory_per_rank"]["nvme"]
states = 16.0 * s["parameters"]
print(f"parameters {s['parameters']/1e9:.2f} B; model states {states/1e9:.1f} GB vs RAM {ram/1e9:.1f} GB")
print(f"NVMe per rank: parameters {max(nv['parameters'])/1e9:.1f} GB, optimizer {max(nv['optimizer_states'])/1e9:.1f} GB"
      " (bf16 runs: the fp32 masters count as optimizer state)")
h = s["memory_per_rank"]["host"]
print("host per rank: parameters %.2f GB, gradients %.2f GB, optimizer %.2f GB, working peak %.2f GB, activations %.2f GB"
      % tuple(max(h[k]) / 1e9 for k in ("parameters", "gradients", "optimizer_states", "working_buffers_peak", "activations")))
print(f"peak RSS per rank: {', '.join('%.2f GB' % (r/1e9) for r in rss)} (sum {sum(rss)/1e9:.1f} GB)")
losses = [json.loads(l)["lm_loss"] for l in open(sys.argv[3]) if '"type": "train"' in l or '"type":"train"' in l]
print(f"steps {steps}, {s['total_seconds']/max(steps,1):.1f} s per step; lm loss per step (fresh samples each step): "
      + " ".join(f"{x:.4f}" for x in losses))
import math
falls = all(math.isfinite(x) for x in losses) and len(losses) > 1 and losses[-1] < losses[0] and max(losses[1:]) < losses[0]
print("  loss finite and below step 1's at every later step" if falls else "  LOSS NOT FALLING (or not finite)")
# The bar: the offload stream's bandwidth (bytes the optimizer sweep moves / its wall time) against
# the best bandwidth nvme_bench measures on the same disk in the same run (its faster direction).
moved = sum(o["optimizer_sweep_bytes_per_step"])
t = max(o["optimizer_sweep_seconds_per_step"])
best = max(R, W)
print(f"nvme_bench (same disk, same run): write {W:.2f} GB/s, read {R:.2f} GB/s (aggregate over {len(rss)} ranks)")
print(f"offload stream (optimizer sweep: read + write of parameters, m, v): {moved/1e9:.1f} GB per step in {t:.1f} s "
      f"= {moved/t/1e9:.2f} GB/s = {moved/t/1e9/best:.0%} of nvme_bench's best ({best:.2f} GB/s); bar >= 80%")
wait = max(o["optimizer_io_wait_seconds_per_step"])
print(f"  of the sweep's {t:.1f} s the update waited {wait:.1f} s for IO (the rest overlapped with it)")
pr = max(o["param_read_seconds_per_step"])
pbytes = 2 * sum(nv["file_bytes"]) / 3  # every fp32 slice read in forward and again in backward
step = s["total_seconds"] / max(steps, 1)
print(f"parameter reads: {pbytes/1e9:.1f} GB per step (all ranks); compute stalled {pr:.1f} s per step waiting for them "
      f"({pr/step:.0%} of the step; prefetched reads overlap the rest)")
EOF
