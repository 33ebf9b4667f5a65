#!/usr/bin/env bash
# generate: tokens/s with the key/value cache against recomputing every position for every new token,
# at 512 positions (a 1-token prompt, 511 new tokens, greedy), alternated over ROUNDS rounds.
#   bench/generate_cache.sh [ROUNDS]     (default 3)
# Model: bench/generate_model.sh's (6 layers, hidden 384, 6 heads, vocab 8192, 512 positions,
# random weights). One process, the CPU ops.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
rounds=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=bench/generate_model.sh
source "$root/bench/generate_model.sh"
generate_model "$tmp"
run() {  # mode -> tokens/s
  local extra=()
  [[ $1 == uncached ]] && extra=(--no-kv-cache)
  "$root/build/apps/generate/generate" --load "$tmp/ckpt" --prompt-ids 1 --max-new-tokens 511 --temperature 0 \
    "${extra[@]}" --json "$tmp/$1.json" >/dev/null
  python3 -c "import json; j=json.load(open('$tmp/$1.json')); assert j['generated_tokens']==511; print(j['tokens_per_second'])"
}
declare -A all=([cached]="" [uncached]="")
for ((r = 1; r <= rounds; ++r)); do
  for m in cached uncached; do
    t=$(run $m)
    all[$m]+="$t "
    echo "round $r/$rounds $m: $t tokens/s"
  done
done
python3 - "${all[cached]}" "${all[uncached]}" <<'PY'
import statistics, sys
c = [float(x) for x in sys.argv[1].split()]; u = [float(x) for x in sys.argv[2].split()]
print(f"median tokens/s at 512 positions: cached {statistics.median(c):.1f}, uncached {statistics.median(u):.1f}, "
      f"ratio {statistics.median(c) / statistics.median(u):.1f}x")
PY
