#!/usr/bin/env bash
# What dropout costs: pretrain_gpt with Megatron's default dropout (0.1 attention, 0.1 hidden)
# against the same run with both at 0, alternated ROUNDS times, medians and their ratio.
#
#   bench/dropout_cost.sh [ROUNDS] [PRECISION]      e.g. bench/dropout_cost.sh 3 bf16
#
# Shape S of train_vs_pytorch.sh (vocab 8192, 6 layers, hidden 384, 6 heads, seq 256, micro-batch
# 8), 2 MPI ranks, mock data, HPCT_BENCH_ITERS timed steps (default 8) after 2 warm-up steps. Needs
# a build in ./build. Prints one line per run and a summary line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
prec=${2:-fp32}
iters=${HPCT_BENCH_ITERS:-8}
warm=2
gpt="$root/build/apps/pretrain_gpt/pretrain_gpt"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
extra=()
[[ "$prec" == bf16 ]] && extra+=(--bf16)

run() {  # dropout -> median tokens/s of the timed steps
  mpirun -np 2 "${mpiflags[@]}" "$gpt" --mock-data --vocab-size 8192 --num-layers 6 --hidden-size 384 \
    --num-attention-heads 6 --seq-length 256 --micro-batch-size 8 --global-batch-size 16 \
    --train-iters $((iters + warm)) --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --attention-dropout "$1" --hidden-dropout "$1" "${extra[@]}" \
    --metrics-file "$tmp/m_$1.jsonl" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log" >&2; exit 1; }
  python3 - "$tmp/m_$1.jsonl" "$warm" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([r["tokens_per_second"] for r in recs if r["type"] == "train"][int(sys.argv[2]):]))
PY
  rm -f "$tmp/m_$1.jsonl"
}

off=() on=()
for r in $(seq 1 "$rounds"); do
  a=$(run 0); b=$(run 0.1)
  off+=("$a"); on+=("$b")
  echo "round $r/$rounds ($prec): dropout 0 $a tok/s, dropout 0.1 $b tok/s"
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"median: dropout 0 {mo:.1f} tok/s, dropout 0.1 {mn:.1f} tok/s, ratio {mn / mo:.3f}")
PY
