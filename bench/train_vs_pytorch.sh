#!/usr/bin/env bash
# hpctrain vs PyTorch (Debian's python3-torch, CPU) on the same GPT shapes, side by side.
#
#   bench/train_vs_pytorch.sh [ROUNDS] [SHAPES] [PRECISIONS]     e.g. bench/train_vs_pytorch.sh 3 "S M" "fp32 bf16"
#
# Shape SE is S with 8 experts top-1 on every other layer: pretrain_moe with EP 2 on the 2 ranks
# against torch_gpt.py --experts 8, DeepSpeed's MoE layer (einsum dispatch) in PyTorch.
# Shape SL is S Llama-shaped: RMSNorm, SwiGLU 1024 wide, rotary positions, 6 query heads on 2
# key/value heads, no biases, an untied head (torch_gpt.py --llama: the same model in PyTorch).
#
# hpctrain: 2 MPI ranks, mock data, dropout 0 (torch_gpt.py has none: equal work). PyTorch: its
# faster set-up here (fp32: 2 DDP processes over gloo, 1 thread each; bf16: 1 process, 2 threads,
# autocast). The two programs alternate ROUNDS times and
# the medians are compared (this machine's timings swing 20-40% run to run). Needs
# `scripts/install_deps.sh --bench` (python3-torch) and a build in ./build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-3}
shapes=${2:-"S M"}
precs=${3:-"fp32 bf16"}
iters=${HPCT_BENCH_ITERS:-8}
warm=2
gpt="$root/build/apps/pretrain_gpt/pretrain_gpt"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"

shape_args() {  # vocab layers hidden heads seq micro experts
  case "$1" in
    S) echo "8192 6 384 6 256 8 0" ;;
    SE) echo "8192 6 384 6 256 8 8" ;;
    SL) echo "8192 6 384 6 256 8 0" ;;
    M) echo "50304 12 768 12 512 4 0" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}

median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

run_hpct() {  # shape prec -> "tps rss"
  read -r V L C NH T MB E <<<"$(shape_args "$1")"
  local extra=() bin=$gpt
  [[ "$2" == bf16 ]] && extra+=(--bf16)
  if [[ "$1" == SL ]]; then
    extra+=(--swiglu --ffn-hidden-size 1024 --normalization rmsnorm --use-rotary-position-embeddings --num-key-value-heads 2
            --disable-bias-linear --untie-embeddings-and-output-weights)
  fi
  if ((E > 0)); then
    bin="$root/build/apps/pretrain_moe/pretrain_moe"
    extra+=(--num-experts "$E" --expert-interval 2 --topk 1 --moe-expert-parallel-size 2 --moe-loss-coeff 0.01)
  fi
  mpirun -np 2 "${mpiflags[@]}" "$bin" --mock-data --vocab-size "$V" --num-layers "$L" --hidden-size "$C" \
    --num-attention-heads "$NH" --seq-length "$T" --micro-batch-size "$MB" --global-batch-size $((MB * 2)) \
    --train-iters $((iters + warm)) --lr 1e-4 --log-interval 1 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0 "${extra[@]}" \
    --metrics-file "$tmp/m.jsonl" >"$tmp/hpct.log" 2>&1 || { cat "$tmp/hpct.log" >&2; exit 1; }
  python3 - "$tmp/m.jsonl" "$warm" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tr = [r["tokens_per_second"] for r in recs if r["type"] == "train"][int(sys.argv[2]):]
s = [r for r in recs if r["type"] == "summary"][-1]
print(statistics.median(tr), max(s["peak_rss_bytes_per_rank"]))
PY
}

run_torch() {  # shape prec -> "tps rss"
  read -r V L C NH T MB E <<<"$(shape_args "$1")"
  local args=(--vocab "$V" --layers "$L" --hidden "$C" --heads "$NH" --seq "$T" --iters "$iters" --warmup "$warm")
  ((E > 0)) && args+=(--experts "$E" --expert-interval 2)
  [[ "$1" == SL ]] && args+=(--llama --kv-heads 2 --ffn 1024)
  if [[ "$2" == bf16 ]]; then
    OMP_NUM_THREADS=2 /usr/bin/python3 "$root/bench/torch_gpt.py" "${args[@]}" --micro-batch $((MB * 2)) --bf16 >"$tmp/t.json"
  else
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 OMP_NUM_THREADS=1 \
        /usr/bin/python3 "$root/bench/torch_gpt.py" "${args[@]}" --micro-batch "$MB" >"$tmp/t$r.json" &
    done
    wait
    cp "$tmp/t0.json" "$tmp/t.json"
  fi
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["tokens_per_second"], d["peak_rss_bytes"])' "$tmp/t.json"
}

echo "# hpctrain vs PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') on $(nproc --all) cores, $(date -u +%F)"
echo "# git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown); rounds $rounds; $iters timed steps after $warm warm-up"
printf "%-6s %-5s %14s %14s %8s %12s %12s %8s\n" shape prec hpct_tok/s torch_tok/s ratio hpct_MiB torch_MiB mem_ratio
for shape in $shapes; do
  for prec in $precs; do
    ht=(); tt=(); hm=(); tm=()
    for ((i = 1; i <= rounds; i++)); do
      read -r a b <<<"$(run_hpct "$shape" "$prec")"; ht+=("$a"); hm+=("$b")
      read -r a b <<<"$(run_torch "$shape" "$prec")"; tt+=("$a"); tm+=("$b")
      echo "  round $i/$rounds $shape $prec: hpctrain ${ht[-1]} tok/s, pytorch ${tt[-1]} tok/s" >&2
    done
    H=$(median "${ht[@]}"); P=$(median "${tt[@]}"); HM=$(median "${hm[@]}"); PM=$(median "${tm[@]}")
    python3 -c 'import sys; h,p,hm,pm=map(float,sys.argv[3:]); print(f"{sys.argv[1]:<6} {sys.argv[2]:<5} {h:14.1f} {p:14.1f} {h/p:8.2f} {hm/2**20:12.0f} {pm/2**20:12.0f} {hm/pm:8.2f}")' \
      "$shape" "$prec" "$H" "$P" "$HM" "$PM"
  done
done
