# shellcheck shell=bash
# Sourced by the generate benchmarks (generate_cache.sh, generate_batch.sh): the model they decode
# with, written to DIR/ckpt. 6 layers, hidden 384, 6 heads, vocab 8192, 512 positions; random
# weights from one step of pretrain_gpt --mock-data (speed does not depend on what the weights
# say). Needs a build in ./build.
#
#   generate_model DIR
generate_model() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  "$root/build/apps/pretrain_gpt/pretrain_gpt" --mock-data --vocab-size 8192 --num-layers 6 --hidden-size 384 \
    --num-attention-heads 6 --seq-length 512 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --lr 1e-4 \
    --eval-iters 0 --save "$1/ckpt" --save-interval 1 >"$1/train.log" 2>&1 || { cat "$1/train.log"; return 1; }
}
