#!/usr/bin/env bash
# What Megatron's per-document flags cost: pretrain_gpt on Brown with --reset-attention-mask
# --reset-position-ids --eod-mask-loss against the same run without them, alternated ROUNDS times,
# medians and their ratio.
#
#   bench/documents_cost.sh [ROUNDS] [PRECISION]      e.g. bench/documents_cost.sh 3 bf16
#
# Shape S of train_vs_pytorch.sh (6 layers, hidden 384, 6 heads, seq 256, micro-batch 8) with
# GPT-2's vocabulary, 2 MPI ranks, data/brown_text_document (documents end at <|endoftext|>),
# HPCT_BENCH_ITERS timed steps (default 8) after 2 warm-up steps, dropout 0 (as the other speed
# benchmarks). Needs a build in ./build and scripts/fetch_data.sh's data. Prints one line per round
# and a summary line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
prec=${2:-fp32}
iters=${HPCT_BENCH_ITERS:-8}
warm=2
gpt="$root/build/apps/pretrain_gpt/pretrain_gpt"
data="$root/data"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
extra=()
[[ "$prec" == bf16 ]] && extra+=(--bf16)

run() {  # on|off -> median tokens/s of the timed steps
  local flags=()
  [[ "$1" == on ]] && flags=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
  mpirun -np 2 "${mpiflags[@]}" "$gpt" --data-path "$data/brown_text_document" --vocab-file "$data/gpt2-vocab.json" \
    --merge-file "$data/gpt2-merges.txt" --num-layers 6 --hidden-size 384 \
    --num-attention-heads 6 --seq-length 256 --micro-batch-size 8 --global-batch-size 16 \
    --train-iters $((iters + warm)) --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --attention-dropout 0 --hidden-dropout 0 "${flags[@]}" "${extra[@]}" \
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
  a=$(run off); b=$(run on)
  off+=("$a"); on+=("$b")
  echo "round $r/$rounds ($prec): without $a tok/s, per-document $b tok/s"
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]
on = [float(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"median: without {mo:.1f} tok/s, per-document {mn:.1f} tok/s, ratio {mn / mo:.3f}")
PY
