#!/usr/bin/env bash
# generate: decode tokens/s at micro-batch 1, 8 and 32 (several prompts stepped together share each
# read of the weights), alternated over ROUNDS rounds.
#   bench/generate_batch.sh [ROUNDS]     (default 3)
# Model: bench/generate_model.sh's (6 layers, hidden 384, 6 heads, vocab 8192, 512 positions, random
# weights from one step of pretrain_gpt --mock-data). Each run: max(batch, 8) samples of a 1-token
# prompt (--num-samples, each from its own stream, temperature 1: no early end on the mock
# vocabulary), 127 new tokens each, the key/value cache; one process, the CPU ops.
# GENERATE=PATH runs another build's generate on the same model (to alternate two builds).
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
run() {  # batch -> tokens/s
  local n=$(($1 > 8 ? $1 : 8))
  "${GENERATE:-$root/build/apps/generate/generate}" --load "$tmp/ckpt" --prompt-ids 1 --num-samples "$n" --max-new-tokens 127 \
    --micro-batch-size "$1" --json "$tmp/b$1.json" >/dev/null
  python3 -c "import json; j=json.load(open('$tmp/b$1.json')); assert j['generated_tokens']==127*$n; print(j['tokens_per_second'])"
}
declare -A all=([1]="" [8]="" [32]="")
for ((r = 1; r <= rounds; ++r)); do
  for b in 1 8 32; do
    t=$(run "$b")
    all[$b]+="$t "
    echo "round $r/$rounds batch $b: $t tokens/s"
  done
done
python3 - "${all[1]}" "${all[8]}" "${all[32]}" <<'PY'
import statistics, sys
m = [statistics.median(float(x) for x in a.split()) for a in sys.argv[1:]]
print(f"median decode tokens/s: batch 1 {m[0]:.1f}, batch 8 {m[1]:.1f} ({m[1] / m[0]:.1f}x), "
      f"batch 32 {m[2]:.1f} ({m[2] / m[0]:.1f}x)")
PY
