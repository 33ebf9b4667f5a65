#!/usr/bin/env bash
# Tensor parallelism on the GPT-2 124M shape (12 layers, hidden 768, 12 heads, vocab 50257 -> 50304):
#  1. memory per rank, measured (the summary's per-rank host bytes of parameters, gradients and
#     optimizer states, and peak RSS) at T = 1, 2 and 4 (1, 2, 4 ranks; ZeRO 0, fp32);
#  2. speed: T=2 x DP=1 against T=1 x DP=2 on 2 ranks, bf16, alternated ROUNDS times (medians and
#     the ratio), with the f/g all-reduce bytes per step against Megatron's formula;
#  3. sequence parallelism at T=2: activation memory per rank (measured: the summary's host
#     activation bytes) and tokens/s with and without --sequence-parallel, alternated, with the
#     collectives' payload and ring bytes.
# Mock data (the speed and memory do not depend on the text). Timings swing 20-40% between runs
# on this machine: compare within one run of this script only.
#
#   bench/tensor_parallel.sh [OUT_DIR]     ROUNDS=3 SEQ=512 ITERS=6 SECTIONS="1 2 3" by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bench/out/tensor_parallel}
rounds=${ROUNDS:-3}
seq=${SEQ:-512}
iters=${ITERS:-6}
sections=" ${SECTIONS:-1 2 3} "
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$out"
gpt=$root/build/apps/pretrain_gpt/pretrain_gpt
shape=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length "$seq" --max-position-embeddings "$seq"
       --mock-data --vocab-size 50257 --lr 1e-4 --eval-iters 0 --log-interval 1000 --seed 1)

run() {  # name ranks args...
  local name=$1 n=$2; shift 2
  mpirun -np "$n" "${mpiflags[@]}" "$gpt" "${shape[@]}" "$@" --json "$out/$name.json" > "$out/$name.log" 2>&1 ||
    { tail -20 "$out/$name.log" >&2; exit 1; }
}

if [[ $sections == *" 1 "* ]]; then
  echo "# 1. memory per rank (fp32, ZeRO 0, micro batch 1, 2 iterations)" >&2
  for t in 1 2 4; do
    run "mem_t$t" "$t" --tensor-model-parallel-size "$t" --micro-batch-size 1 --global-batch-size 1 --train-iters 2
  done
fi
if [[ $sections == *" 2 "* ]]; then
  echo "# 2. speed: T=2 vs DP=2 (bf16, micro batch 1, global batch 2, $iters iterations, seq $seq), $rounds rounds" >&2
  for r in $(seq 1 "$rounds"); do
    run "tp2_r$r" 2 --tensor-model-parallel-size 2 --bf16 --micro-batch-size 1 --global-batch-size 1 --train-iters "$iters"
    run "dp2_r$r" 2 --bf16 --micro-batch-size 1 --global-batch-size 2 --train-iters "$iters"
  done
fi
if [[ $sections == *" 3 "* ]]; then
  echo "# 3. sequence parallel at T=2 (bf16, micro batch 4, $iters iterations, seq $seq), $rounds rounds" >&2
  for r in $(seq 1 "$rounds"); do
    for sp in 0 1; do
      run "sp${sp}_r$r" 2 --tensor-model-parallel-size 2 --bf16 --micro-batch-size 4 --global-batch-size 4 \
        --train-iters "$iters" $([[ $sp == 1 ]] && echo --sequence-parallel)
    done
  done
fi
python3 - "$out" "$rounds" "$sections" <<'PY'
import json, statistics, sys
out, rounds, sections = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
load = lambda n: json.load(open(f"{out}/{n}.json"))
GB = 2**30
if "1" in sections:
  print("| T | ranks | parameters per rank | params GiB | grads GiB | optimizer GiB | states GiB | peak RSS GiB |")
  print("|---|---|---|---|---|---|---|---|")
  base = None
  for t in (1, 2, 4):
      s = load(f"mem_t{t}")
      h = s["memory_per_rank"]["host"]
      st = h["parameters"][0] + h["gradients"][0] + h["optimizer_states"][0]
      base = base or st
      print(f"| {t} | {t} | {s['parameters_per_rank']:,} | {h['parameters'][0]/GB:.3f} | {h['gradients'][0]/GB:.3f} | "
            f"{h['optimizer_states'][0]/GB:.3f} | {st/GB:.3f} ({st/base:.2f}x) | {max(s['peak_rss_bytes_per_rank'])/GB:.2f} |")
if "2" in sections:
  tp = [load(f"tp2_r{r}") for r in range(1, rounds + 1)]
  dp = [load(f"dp2_r{r}") for r in range(1, rounds + 1)]
  # tokens per second over the run; T=2 processes 1 sample per step on 2 ranks, DP=2 two samples.
  tps_tp = statistics.median(s["tokens_per_second"] for s in tp)
  tps_dp = statistics.median(s["tokens_per_second"] for s in dp)
  print()
  print(f"speed, medians of {rounds}: T=2 x DP=1 {tps_tp:.0f} tokens/s, T=1 x DP=2 {tps_dp:.0f} tokens/s, "
        f"ratio T/DP {tps_tp/tps_dp:.2f}")
  t = tp[0]["tensor_parallel"]
  print(f"T=2 f/g all-reduce bytes per step per rank: {t['allreduce_bytes_per_step_per_rank'][0]:.0f}; "
        f"Megatron's 4 x B*s*h x L x 4 B: {t['megatron_layer_formula_bytes_per_step']:.0f}; "
        f"ratio {t['allreduce_bytes_per_step_per_rank'][0]/t['megatron_layer_formula_bytes_per_step']:.4f} (= (4L+2)/4L = 50/48)")
  print(f"DP=2 gradient all-reduce bytes per step per rank (ring): {dp[0]['comm_bytes_per_step_per_rank'][0]:.0f}")

if "3" in sections:
  runs = {sp: [load(f"sp{sp}_r{r}") for r in range(1, rounds + 1)] for sp in (0, 1)}
  act = {sp: max(runs[sp][0]["memory_per_rank"]["host"]["activations"]) for sp in (0, 1)}
  tps = {sp: statistics.median(s["tokens_per_second"] for s in runs[sp]) for sp in (0, 1)}
  print()
  print("| T=2 | activations per rank MiB | tokens/s (median) | payload bytes/step | ring bytes/step | peak RSS GiB |")
  print("|---|---|---|---|---|---|")
  for sp in (0, 1):
    t = runs[sp][0]["tensor_parallel"]
    print(f"| {'sequence parallel' if sp else 'all-reduce'} | {act[sp]/2**20:.1f} ({act[sp]/act[0]:.2f}x) | {tps[sp]:.0f} "
          f"({tps[sp]/tps[0]:.2f}x) | {t['allreduce_bytes_per_step_per_rank'][0]:.0f} | "
          f"{t['wire_bytes_per_step_per_rank'][0]:.0f} | {max(runs[sp][0]['peak_rss_bytes_per_rank'])/GB:.2f} |")
PY
