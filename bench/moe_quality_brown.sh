#!/usr/bin/env bash
# MoE vs dense quality on real text: gpt-tiny (dense) against moe-tiny (the same shape, 8 experts
# top-1 on every other layer, EP = 2) on the bundled Brown corpus, same data order, same
# iterations; validation loss every EVAL iterations; then scripts/plot_metrics.py draws both runs.
# Prints each run's final validation loss and perplexity and where the PNG is.
#
#   bench/moe_quality_brown.sh [ITERS] [OUT_DIR]      defaults: 400, bench/out/moe_quality_brown
# Needs a build in ./build and the data of scripts/fetch_data.sh in ./data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-400}
out=${2:-$root/bench/out/moe_quality_brown}
eval_every=${EVAL:-50}
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$out"
# shellcheck disable=SC2054  # 949,50,1 is one value
data=(--data-path "$root/data/brown_text_document" --vocab-file "$root/data/gpt2-vocab.json"
      --merge-file "$root/data/gpt2-merges.txt" --split 949,50,1)
common=(--train-iters "$iters" --log-interval 10 --eval-interval "$eval_every" --eval-iters 10 --seed 1234)

run() {  # name binary args-file extra...
  local name=$1 bin=$2 args=$3; shift 3
  rm -f "$out/$name.jsonl" "$out/$name.jsonl.discarded"
  echo "# $name: $(basename "$bin") @$(basename "$args") $* ($iters iterations)" >&2
  mpirun -np 2 "${mpiflags[@]}" "$bin" "@$args" "${data[@]}" "${common[@]}" "$@" \
    --metrics-file "$out/$name.jsonl" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; exit 1; }
  python3 - "$out/$name.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("%s: final validation loss %.4f, perplexity %.1f, %.0f tokens/s"
      % (sys.argv[2], s["final_val_loss"], s["final_val_ppl"], s["tokens_per_second"]))
PY
}
run dense "$root/build/apps/pretrain_gpt/pretrain_gpt" "$root/inputs/gpt-tiny.args"
run moe8 "$root/build/apps/pretrain_moe/pretrain_moe" "$root/inputs/moe-tiny.args" --moe-expert-parallel-size 2
py=python3
python3 -c 'import matplotlib' 2>/dev/null || py=/usr/bin/python3
"$py" "$root/scripts/plot_metrics.py" "$out/dense.jsonl" "$out/moe8.jsonl" --label "dense (gpt-tiny)" \
  --label "MoE 8 experts top-1, EP 2" --title "Brown corpus, 2 ranks, $iters iterations" -o "$out/moe_vs_dense_brown.png"
