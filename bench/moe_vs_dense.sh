#!/usr/bin/env bash
# MoE vs dense tokens/s on the same shape (equal active parameters per token): pretrain_moe with E
# experts, top-1, on every other layer, EP = 2 on 2 ranks, against pretrain_gpt (dense), and
# optionally a second dense binary (OLD_GPT=path: the build before a change), alternated ROUNDS
# times; medians and ratios. Mock data, bf16 unless PREC=fp32. Needs a build in ./build.
#
#   bench/moe_vs_dense.sh [ROUNDS] [EXPERTS]        e.g. OLD_GPT=/tmp/old/build/apps/pretrain_gpt/pretrain_gpt bench/moe_vs_dense.sh 3 8
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
experts=${2:-8}
iters=${HPCT_BENCH_ITERS:-8}
prec=${PREC:-bf16}
gpt="$root/build/apps/pretrain_gpt/pretrain_gpt"
moe="$root/build/apps/pretrain_moe/pretrain_moe"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
shape=(--mock-data --vocab-size 8192 --num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 256
       --micro-batch-size 8 --global-batch-size 16 --train-iters "$iters" --lr 1e-4 --log-interval 1000 --eval-iters 0)
[[ "$prec" == bf16 ]] && shape+=(--bf16)
moeflags=(--num-experts "$experts" --expert-interval 2 --topk 1 --moe-expert-parallel-size 2 --moe-loss-coeff 0.01)

tps() {  # binary args... -> tokens/s of the run (JSON summary)
  local bin=$1; shift
  mpirun -np 2 "${mpiflags[@]}" "$bin" "${shape[@]}" "$@" --json "$tmp/s.json" > "$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$tmp/s.json"
}
a2a() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["moe"]["alltoall_bytes_per_step_per_rank"][0])' "$tmp/s.json"; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

declare -a D M O
for r in $(seq "$rounds"); do
  D+=("$(tps "$gpt")")
  M+=("$(tps "$moe" "${moeflags[@]}")"); bytes=$(a2a)
  if [[ -n "${OLD_GPT:-}" ]]; then O+=("$(tps "$OLD_GPT")"); fi
  echo "round $r/$rounds: dense ${D[-1]} tok/s, MoE ${M[-1]} tok/s${OLD_GPT:+, dense (OLD_GPT) ${O[-1]} tok/s}" >&2
done
d=$(median "${D[@]}"); m=$(median "${M[@]}")
echo "shape: 6 layers, hidden 384, seq 256, micro 8, 2 ranks, $prec; MoE: $experts experts top-1 on layers 2,4,6, EP 2"
printf "dense   median %.0f tokens/s  (%s)\n" "$d" "${D[*]}"
printf "MoE     median %.0f tokens/s  (%s)  ratio MoE/dense %.3f\n" "$m" "${M[*]}" "$(python3 -c "print($m/$d)")"
printf "MoE all-to-all bytes per step per rank (measured): %.0f\n" "$bytes"
if [[ -n "${OLD_GPT:-}" ]]; then
  o=$(median "${O[@]}")
  printf "dense (OLD_GPT) median %.0f tokens/s  (%s)  ratio new/old %.3f\n" "$o" "${O[*]}" "$(python3 -c "print($d/$o)")"
fi
