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
# and a summary line (bench/ab_tokens.sh).
set -euo pipefail
# shellcheck source=bench/ab_tokens.sh
source "$(dirname "$0")/ab_tokens.sh"
data="$ab_root/data"
ab_common=(--data-path "$data/brown_text_document" --vocab-file "$data/gpt2-vocab.json" --merge-file "$data/gpt2-merges.txt"
           --num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --micro-batch-size 8
           --global-batch-size 16 --lr 1e-4 --attention-dropout 0 --hidden-dropout 0)
ab_flags_A=()
ab_flags_B=(--reset-attention-mask --reset-position-ids --eod-mask-loss)
ab_main "${1:-3}" "${2:-fp32}" "without" "per-document"
