#!/usr/bin/env bash
# TED on 4 ranks: one MoE shape on the three tensor x expert x data grids (T2 x E2, T2 x D2,
# E2 x D2), duplicate token dropping on and off, tensor-parallel experts, and recomputation with and
# without communication-aware checkpointing; alternated ROUNDS times, medians of tokens/s, and the
# runs' own counters: all-to-all bytes and calls, the MoE layers' tensor-parallel bytes, the
# tensor-parallel activation bytes and what CAC keeps. Mock data, bf16 unless PREC=fp32. Needs a
# build in ./build. OUT=dir keeps each run's summary (last round).
#
#   bench/ted.sh [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
iters=${HPCT_BENCH_ITERS:-6}
prec=${PREC:-bf16}
moe="$root/build/apps/pretrain_moe/pretrain_moe"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=${OUT:-$tmp}
mkdir -p "$out"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
shape=(--mock-data --vocab-size 8192 --num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 128
       --micro-batch-size 4 --global-batch-size 16 --train-iters "$iters" --lr 1e-4 --log-interval 1000 --eval-iters 0
       --num-experts 8 --expert-interval 2 --topk 1 --moe-loss-coeff 0.01)
[[ "$prec" == bf16 ]] && shape+=(--bf16)

names=(t2e2 t2e2_nodtd t2d2 e2d2 t2e2_etp t2e2_recompute t2e2_cac)
declare -A flags=(
  [t2e2]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 2"
  [t2e2_nodtd]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 2 --disable-duplicate-token-dropping"
  [t2d2]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 1"
  [e2d2]="--tensor-model-parallel-size 1 --moe-expert-parallel-size 2"
  [t2e2_etp]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 2 --enable-expert-tensor-parallelism"
  [t2e2_recompute]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 2 --checkpoint-activations"
  [t2e2_cac]="--tensor-model-parallel-size 2 --moe-expert-parallel-size 2 --checkpoint-activations --communication-aware-checkpointing"
)
declare -A tps
total=$((rounds * ${#names[@]})); n=0; start=$(date +%s)
for r in $(seq "$rounds"); do
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086
    mpirun -np 4 "${mpiflags[@]}" "$moe" "${shape[@]}" ${flags[$name]} --json "$out/$name.json" > "$tmp/log" 2>&1 ||
      { cat "$tmp/log" >&2; exit 1; }
    t=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$out/$name.json")
    tps[$name]+="$t "
    n=$((n + 1)); el=$(( $(date +%s) - start ))
    echo "round $r/$rounds $name: $t tokens/s | $n/$total runs, ETA $(( el * (total - n) / n )) s" >&2
  done
done

echo "shape: 4 layers, hidden 256, 8 heads, seq 128, micro 4, global 16, 8 experts top-1 on layers 2 and 4, $prec, 4 ranks, $iters steps"
python3 - "$out" "${names[@]}" <<EOF
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
tps = {$(for n in "${names[@]}"; do printf '"%s": [%s], ' "$n" "$(echo ${tps[$n]} | tr ' ' ',')"; done)}
s = {n: json.load(open(f"{out}/{n}.json")) for n in names}
base = statistics.median(tps["t2e2"])
print(f"{'run':16} {'tokens/s':>9} {'vs t2e2':>7} {'a2a B/step r0':>14} {'a2a calls':>9} {'moe tp B/step r0':>16} {'tp act B/step':>13} {'CAC kept B':>10}")
for n in names:
    j, m = s[n], s[n].get("moe", {})
    tpb = j.get("tensor_parallel", {}).get("allreduce_bytes_per_step_per_rank", [0])[0]
    kept = j.get("activation_checkpointing", {}).get("kept_for_replay_bytes_per_rank", [0])[0]
    med = statistics.median(tps[n])
    print(f"{n:16} {med:9.0f} {med / base:7.3f} {m['alltoall_bytes_per_step_per_rank'][0]:14.0f} "
          f"{m['alltoall_calls_per_step']:9.0f} {m['tp_bytes_per_step_per_rank'][0]:16.0f} {tpb:13.0f} {kept:10.0f}")
# Duplicate token dropping against the formula: each tensor-parallel pair's rows (less the counts
# exchange, (E-1) x El ints per MoE layer and micro-batch) sum to what one rank sends without it.
on, off = s["t2e2"]["moe"]["alltoall_bytes_per_step_per_rank"], s["t2e2_nodtd"]["moe"]["alltoall_bytes_per_step_per_rank"]
micro = 16 // (4 * 2)  # global / (micro x dense data-parallel ranks)
counts = 2 * micro * (2 - 1) * 4 * 4
pairs = [(on[0] - counts) + (on[1] - counts), (on[2] - counts) + (on[3] - counts)]
print(f"DTD: all-to-all bytes per step per rank {[round(x) for x in on]} vs {[round(x) for x in off]} without; "
      f"row bytes of each tensor-parallel pair {[round(p) for p in pairs]} = one rank's without {round(off[0] - counts)}: "
      f"{all(p == off[0] - counts for p in pairs)}; per rank {sum(off) / sum(on):.2f}x fewer")
print("tokens/s rounds:", {n: [round(x) for x in tps[n]] for n in names})
EOF
