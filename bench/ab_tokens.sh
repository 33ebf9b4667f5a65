# shellcheck shell=bash disable=SC2154  # ab_common, ab_flags_A, ab_flags_B: set by the sourcing script
# Sourced by the A/B cost benchmarks (dropout_cost.sh, documents_cost.sh): pretrain_gpt on 2 MPI
# ranks with a common flag set and one of two variants, alternated ROUNDS times; medians of the
# timed steps' tokens/s and their ratio.
#
#   ab_main ROUNDS PRECISION LABEL_A LABEL_B   after defining
#   ab_common=(...)   flags of every run     ab_flags_A=(...)   ab_flags_B=(...)   the two variants
#
# HPCT_BENCH_ITERS timed steps (default 8) after 2 warm-up steps. Needs a build in ./build. Prints
# one line per round and a summary line.
ab_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ab_iters=${HPCT_BENCH_ITERS:-8}
ab_warm=2
ab_mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then ab_mpiflags+=(--allow-run-as-root); fi
ab_tmp=$(mktemp -d)
trap 'rm -rf "$ab_tmp"' EXIT
# shellcheck source=scripts/env.sh
source "$ab_root/scripts/env.sh"

ab_run() {  # PRECISION VARIANT(A|B) -> median tokens/s of the timed steps
  local extra=() flags=()
  [[ "$1" == bf16 ]] && extra+=(--bf16)
  if [[ "$2" == A ]]; then flags=("${ab_flags_A[@]}"); else flags=("${ab_flags_B[@]}"); fi
  mpirun -np 2 "${ab_mpiflags[@]}" "$ab_root/build/apps/pretrain_gpt/pretrain_gpt" "${ab_common[@]}" \
    --train-iters $((ab_iters + ab_warm)) --log-interval 1 --eval-iters 0 "${flags[@]}" "${extra[@]}" \
    --metrics-file "$ab_tmp/m_$2.jsonl" >"$ab_tmp/run.log" 2>&1 || { cat "$ab_tmp/run.log" >&2; exit 1; }
  python3 - "$ab_tmp/m_$2.jsonl" "$ab_warm" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median([r["tokens_per_second"] for r in recs if r["type"] == "train"][int(sys.argv[2]):]))
PY
  rm -f "$ab_tmp/m_$2.jsonl"
}

ab_main() {  # ROUNDS PRECISION LABEL_A LABEL_B
  local rounds=$1 prec=$2 la=$3 lb=$4 a b
  local as=() bs=()
  for r in $(seq 1 "$rounds"); do
    a=$(ab_run "$prec" A)
    b=$(ab_run "$prec" B)
    as+=("$a")
    bs+=("$b")
    echo "round $r/$rounds ($prec): $la $a tok/s, $lb $b tok/s"
  done
  python3 - "${as[*]}" "${bs[*]}" "$la" "$lb" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"median: {sys.argv[3]} {ma:.1f} tok/s, {sys.argv[4]} {mb:.1f} tok/s, ratio {mb / ma:.3f}")
PY
}
