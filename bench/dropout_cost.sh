#!/usr/bin/env bash
# What dropout costs: pretrain_gpt with Megatron's default dropout (0.1 attention, 0.1 hidden)
# against the same run with both at 0, alternated ROUNDS times, medians and their ratio.
#
#   bench/dropout_cost.sh [ROUNDS] [PRECISION]      e.g. bench/dropout_cost.sh 3 bf16
#
# Shape S of train_vs_pytorch.sh (vocab 8192, 6 layers, hidden 384, 6 heads, seq 256, micro-batch
# 8), 2 MPI ranks, mock data, HPCT_BENCH_ITERS timed steps (default 8) after 2 warm-up steps. Needs
# a build in ./build. Prints one line per run and a summary line (bench/ab_tokens.sh).
set -euo pipefail
# shellcheck source=bench/ab_tokens.sh
source "$(dirname "$0")/ab_tokens.sh"
ab_common=(--mock-data --vocab-size 8192 --num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 256
           --micro-batch-size 8 --global-batch-size 16 --lr 1e-4)
ab_flags_A=(--attention-dropout 0 --hidden-dropout 0)
ab_flags_B=(--attention-dropout 0.1 --hidden-dropout 0.1)
ab_main "${1:-3}" "${2:-fp32}" "dropout 0" "dropout 0.1"
