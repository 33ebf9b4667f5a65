#!/usr/bin/env bash
# Two builds of pretrain_gpt on the same run, alternated: a redesign commit must not lower CPU
# tokens/s. The run is bench/train_vs_pytorch.sh's hpctrain command for shape S, fp32 (2 ranks,
# mock data, dropout 0, 10 iterations, the first 2 not counted); prints each run's median tokens/s.
#
#   bench/ab_builds.sh OLD_PRETRAIN_GPT NEW_PRETRAIN_GPT [ROUNDS]
#   e.g. git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/oldbuild -DCMAKE_BUILD_TYPE=Release \
#        -DHPCT_BUILD_TESTS=OFF && cmake --build /tmp/oldbuild --target pretrain_gpt
#        bench/ab_builds.sh /tmp/oldbuild/apps/pretrain_gpt/pretrain_gpt build/apps/pretrain_gpt/pretrain_gpt 4
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=${1:?old pretrain_gpt}
new=${2:?new pretrain_gpt}
rounds=${3:-4}
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  rm -f "$tmp/m.jsonl"
  mpirun -np 2 "${mpiflags[@]}" "$1" --mock-data --vocab-size 8192 --num-layers 6 --hidden-size 384 \
    --num-attention-heads 6 --seq-length 256 --micro-batch-size 8 --global-batch-size 16 --train-iters 10 --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0 --metrics-file "$tmp/m.jsonl" \
    >"$tmp/log" 2>&1 || { tail "$tmp/log" >&2; exit 1; }
  python3 -c 'import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(round(statistics.median([x["tokens_per_second"] for x in r if x["type"] == "train"][2:]), 1))' "$tmp/m.jsonl"
}
for ((i = 0; i < rounds; ++i)); do
  echo "old $(run "$old")"
  echo "new $(run "$new")"
done
