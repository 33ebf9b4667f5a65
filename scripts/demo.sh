#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, fetches the default data and
# trains the tiny GPT on the Brown corpus with 2 MPI ranks, printing Megatron-style progress and,
# at the end, the validation perplexity next to the unigram baseline; then saves the model and
# prints a short sample of text from it (generate).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
bash "$root/scripts/fetch_data.sh"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$root/runs"
iters=${HPCT_DEMO_ITERS:-400}
rm -rf "$root/runs/demo_ckpt"
mpirun -np 2 "${mpiflags[@]}" "$root/build/apps/pretrain_gpt/pretrain_gpt" \
  @"$root/inputs/gpt-tiny.args" \
  --data-path "$root/data/brown_text_document" \
  --vocab-file "$root/data/gpt2-vocab.json" --merge-file "$root/data/gpt2-merges.txt" \
  --split 949,50,1 --train-iters "$iters" --log-interval 10 --eval-interval 100 --eval-iters 10 \
  --save "$root/runs/demo_ckpt" --save-interval "$iters" \
  --metrics-file "$root/runs/demo_metrics.jsonl" --json "$root/runs/demo_summary.json"
echo "> a sample from the trained model (generate --temperature 0.8 --top-p 0.9):"
"$root/build/apps/generate/generate" --load "$root/runs/demo_ckpt" --prompt "The jury said" \
  --max-new-tokens 40 --temperature 0.8 --top-p 0.9 --seed 1
