#!/usr/bin/env bash
# On a GPU node: the gpu-labelled checks, then a bf16 training benchmark of `pretrain_gpt --device
# cuda` against PyTorch's bf16 on the same GPU, in three modes: GPU-resident ZeRO (every state and
# AdamW on the GPU; attention through cuDNN's fused kernel where it serves, the start line's
# "> attention:" says which), the same with --attention-kernel plain (the materialised softmax: what
# the fused kernel bought), ZeRO-Offload (AdamW on the host, beside the next step's forward) and
# ZeRO-Offload with --no-optimizer-overlap (what running the host step beside the forward bought).
#
#   bench/gpu_train.sh [BIN]      BIN: a folder holding pretrain_gpt and the test_*_cuda binaries
#                                 (default: the build tree ./build; bench/gpu_bundle.sh makes one
#                                 that runs on a node without our Debian packages)
# Environment: CHECKS=0 skips the checks, TORCH=0 the PyTorch runs, MOE=0 the MoE-vs-dense runs (bench/gpu_moe.sh), SHAPES (default "124m 350m"), MODES (default "resident plain offload offload-wait"), ITERS timed steps
# (default 4) after WARM (default 2), ACCUM micro-batches per step (default 8), OUTDIR (default
# bench/out/gpu). Runs needing mpirun (2 ranks) are left out where there is none (a bundle).
#
# Throughput is tokens per second of the median step; TFLOP/s use Megatron's formula as the trainer
# logs it (Gpt::flops_per_iteration: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)), x3/4 without recompute);
# MFU is that over the bf16 matrix rate measured on this GPU at the start (an 8192^3 product through
# PyTorch's cuBLAS), and over the datasheet's 989 TFLOP/s (H100/H200 SXM dense bf16).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-}
b() {  # binary name -> path
  if [[ -n "$bin" ]]; then echo "$bin/$1"; else find "$root/build" -name "$1" -type f -perm -u+x | head -1; fi
}
out=${OUTDIR:-$root/bench/out/gpu}
mkdir -p "$out"
iters=${ITERS:-4} warm=${WARM:-2} accum=${ACCUM:-8}
py=${PYTHON:-python3}
fails=0

echo "# GPU and host"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

if [[ ${CHECKS:-1} == 1 ]]; then  # CHECKS=0: the benchmark alone
echo "# gpu-labelled tests"
for t in test_kernels_cuda test_ops_backend_cuda test_transfers_cuda test_fusions_cuda test_linear_cuda test_head_cuda test_moe_gate_cuda test_gpt_cuda test_nccl_queued; do
  exe=$(b $t)
  timeout 90 "$exe" --gtest_brief=1 >"$out/$t.log" 2>&1
  rc=$?
  skipped=$(grep -c '\[  SKIPPED \]' "$out/$t.log")
  summary=$(grep -E '^\[  (PASSED|FAILED) +\]' "$out/$t.log" | tr '\n' ' ')
  echo "$t: exit $rc, $summary skipped lines: $skipped"
  ((rc != 0 || skipped != 0)) && { fails=$((fails + 1)); tail -40 "$out/$t.log"; }
done
# cuBLASLt's bias epilogue (bias_gemm.hpp) failing its test: the benchmark without it.
if grep -q 'FAILED.*BiasInTheGemm' "$out/test_linear_cuda.log" 2>/dev/null; then
  export HPCT_CUBLASLT=0
  echo "cuBLASLt's bias epilogue failed its test: what follows runs with HPCT_CUBLASLT=0 (GEMM, then a bias pass)"
fi
# cuDNN's own account of a fused-attention failure (its error log names the descriptor and reason).
if grep -q 'FAILED.*\(Fused\|CudaFusions.Attention\)' "$out"/test_ops_backend_cuda.log "$out"/test_gpt_cuda.log \
  "$out"/test_fusions_cuda.log 2>/dev/null; then
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$out/cudnn_fused.log" timeout 60 "$(b test_ops_backend_cuda)" \
    --gtest_filter='*Fused*' >"$out/fused_rerun.log" 2>&1
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$out/cudnn_fusions.log" timeout 60 "$(b test_fusions_cuda)" \
    --gtest_filter='CudaFusions.Attention*' >"$out/fusions_rerun.log" 2>&1
  echo "fused attention failed: cuDNN's log in $out/cudnn_fused.log (first lines):"; head -30 "$out/cudnn_fused.log"
fi
# GPU-resident ZeRO: stages 0-2 on the GPU against the CPU backend (one rank).
timeout 150 "$py" "$root/tests/apps/cuda_resident_check.py" --gpt "$(b pretrain_gpt)" --args "$root/inputs/gpt-tiny.args" \
  --workdir "$out/cuda_resident" >"$out/cuda_resident.log" 2>&1
rc=$?
echo "cuda_resident_check: exit $rc"; tail -8 "$out/cuda_resident.log"
((rc != 0)) && fails=$((fails + 1))
timeout 150 "$py" "$root/tests/apps/cuda_offload_check.py" --mode train --gpt "$(b pretrain_gpt)" \
  --args "$root/inputs/gpt-tiny.args" --workdir "$out/cuda_train" >"$out/cuda_train.log" 2>&1
rc=$?
echo "cuda_offload_check --mode train: exit $rc"; tail -4 "$out/cuda_train.log"
((rc != 0)) && fails=$((fails + 1))
if command -v mpirun >/dev/null; then
mpi=(mpirun --oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpi+=(--allow-run-as-root); fi
# Tensor parallelism on the GPU: 2 ranks sharing it, collectives staged through the host.
t=test_tensor_parallel_cuda
timeout 120 "${mpi[@]}" -np 2 "$(b $t)" --gtest_brief=1 --gtest_filter=-*Nccl* >"$out/$t.log" 2>&1
rc=$?
skipped=$(grep -c '\[  SKIPPED \]' "$out/$t.log")
echo "$t (2 ranks): exit $rc, $(grep -E '^\[  (PASSED|FAILED) +\]' "$out/$t.log" | tr '\n' ' ') skipped lines: $skipped"
((rc != 0 || skipped != 0)) && { fails=$((fails + 1)); tail -40 "$out/$t.log"; }
# The same through NCCL on device buffers: one GPU per rank, so only where there are two.
if (($(nvidia-smi -L | grep -c '^GPU') >= 2)); then
  timeout 120 "${mpi[@]}" -np 2 "$(b $t)" --gtest_brief=1 --gtest_filter=*Nccl* >"$out/${t}_nccl.log" 2>&1
  rc=$?
  skipped=$(grep -c '\[  SKIPPED \]' "$out/${t}_nccl.log")
  echo "$t through NCCL (2 ranks, 2 GPUs): exit $rc, $(grep -E '^\[  (PASSED|FAILED) +\]' "$out/${t}_nccl.log" |
    tr '\n' ' ') skipped lines: $skipped"
  ((rc != 0 || skipped != 0)) && { fails=$((fails + 1)); tail -40 "$out/${t}_nccl.log"; }
else
  echo "$t through NCCL: not run (one GPU; NCCL needs a GPU per rank)"
fi
timeout 150 "$py" "$root/tests/apps/cuda_offload_check.py" --mode tp --gpt "$(b pretrain_gpt)" \
  --args "$root/inputs/gpt-tiny.args" --workdir "$out/cuda_tp" --mpi "${mpi[*]} -np 2" >"$out/cuda_tp.log" 2>&1
rc=$?
echo "cuda_offload_check --mode tp: exit $rc"; tail -15 "$out/cuda_tp.log"
((rc != 0)) && fails=$((fails + 1))
# pretrain_moe on the GPU: EP 1, EP 2 and a T2 x E2 TED grid against the CPU.
timeout 200 "$py" "$root/tests/apps/cuda_moe_check.py" --moe "$(b pretrain_moe)" --workdir "$out/cuda_moe" \
  --mpi "${mpi[0]} -np 2 ${mpi[*]:1}" >"$out/cuda_moe.log" 2>&1
rc=$?
echo "cuda_moe_check: exit $rc"; tail -15 "$out/cuda_moe.log"
((rc != 0)) && fails=$((fails + 1))
else
  echo "2-rank GPU checks (tensor parallelism, MoE): not run (no mpirun here)"
fi
fi

echo "# bf16 matrix rate on this GPU (8192^3 through PyTorch)"
peak=$("$py" - <<'PY'
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); a @ b; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
print(2 * 8192**3 / sorted(ts)[5] / 1e12)
PY
)
echo "measured bf16 GEMM: ${peak:-?} TFLOP/s"

shape() {  # name -> "V L H NH T MB"
  case $1 in
    124m) echo "50304 12 768 12 1024 8" ;;
    350m) echo "50304 24 1024 16 1024 8" ;;
    760m) echo "50304 24 1536 16 1024 4" ;;
    1.3b) echo "50304 24 2048 16 1024 4" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}
megatron_flops() {  # V L H T tokens_per_step -> FLOPs per step without recompute (x3/4)
  "$py" -c "V,L,h,s,n=map(float,'$*'.split()); print(0.75*(6*n*h*V+L*96*n*h*h*(1+s/(6*h))))"
}

echo "# bf16 training: pretrain_gpt --device cuda vs PyTorch (same GPU)"
printf '%-6s %-28s %12s %10s %8s %8s %s\n' shape program tokens/s TFLOP/s MFU MFU/989 "peak device memory"
for s in ${SHAPES:-124m 350m}; do
  read -r V L H NH T MB <<<"$(shape "$s")"
  for mode in ${MODES:-resident plain offload offload-wait}; do
  cfg="$out/${mode}_$s.json"
  if [[ $mode == offload* ]]; then
    echo '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' >"$cfg"
  else
    echo '{"zero_optimization": {"stage": 1}}' >"$cfg"
  fi
  tag=${mode}_$s
  kernel=(); [[ $mode == plain ]] && kernel=(--attention-kernel plain)
  [[ $mode == offload-wait ]] && kernel=(--no-optimizer-overlap)
  rm -f "$out/hpct_$tag.jsonl" "$out/hpct_$tag.json"
  timeout 300 "$(b pretrain_gpt)" --mock-data --vocab-size "$V" --num-layers "$L" --hidden-size "$H" \
    --num-attention-heads "$NH" --seq-length "$T" --micro-batch-size "$MB" --global-batch-size $((MB * accum)) \
    --train-iters $((iters + warm)) --lr 1e-4 --log-interval 1 --eval-iters 0 --attention-dropout 0 --hidden-dropout 0 --bf16 --device cuda \
    "${kernel[@]}" --deepspeed_config "$cfg" --metrics-file "$out/hpct_$tag.jsonl" --json "$out/hpct_$tag.json" \
    >"$out/hpct_$tag.log" 2>&1
  rc=$?
  if ((rc != 0)); then
    echo "$s pretrain_gpt ($mode): exit $rc"; tail -20 "$out/hpct_$tag.log"; fails=$((fails + 1))
  else
    "$py" - "$out/hpct_$tag.jsonl" "$out/hpct_$tag.json" "$warm" "${peak:-0}" "$s" "$mode" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tr = [r for r in recs if r["type"] == "train"][int(sys.argv[3]):]
tps = statistics.median(r["tokens_per_second"] for r in tr)
tf = statistics.median(r["tflops_per_rank"] for r in tr)
dev = json.load(open(sys.argv[2]))["memory_per_rank"]["device"]
mem = (dev["parameters_and_gradients"][0] + dev.get("optimizer_states", [0])[0] + dev["activations"][0]) / 2**30
peak = float(sys.argv[4])
what = "params+grads+" if sys.argv[6].startswith("offload") else "states+"
print(f"{sys.argv[5]:<6} {'hpctrain (' + sys.argv[6] + ')':<28} {tps:12.0f} {tf:10.1f} {100*tf/peak if peak else 0:7.1f}% "
      f"{100*tf/989:7.1f}%  {mem:.1f} GiB ({what}activations)")
PY
    echo "       $(grep -m1 '^> attention:' "$out/hpct_$tag.log")"
    [[ $mode == offload* ]] && echo "       $(grep -m1 '^> host AdamW be' "$out/hpct_$tag.log")"
  fi
  done
  [[ ${TORCH:-1} == 1 ]] || continue
  for att in naive sdpa; do
    extra=(); [[ $att == sdpa ]] && extra=(--sdpa)
    r=$(timeout 120 "$py" "$root/bench/torch_gpt.py" --device cuda --bf16 --vocab "$V" --layers "$L" --hidden "$H" \
      --heads "$NH" --seq "$T" --micro-batch "$MB" --accum "$accum" --iters "$iters" --warmup "$warm" "${extra[@]}" 2>"$out/torch_${s}_$att.err")
    if [[ -z "$r" ]]; then echo "$s torch $att: failed"; tail -5 "$out/torch_${s}_$att.err"; continue; fi
    tps=$("$py" -c "import json; print(json.loads('$r')['tokens_per_second'])")
    mem=$("$py" -c "import json; print(json.loads('$r')['peak_device_bytes']/2**30)")
    fl=$(megatron_flops "$V" "$L" "$H" "$T" "$tps")
    "$py" -c "tf=$fl/1e12; pk=float('${peak:-0}' or 0); print(f\"$s     {'PyTorch bf16 ($att attention)':<28} {$tps:12.0f} {tf:10.1f} {100*tf/pk if pk else 0:7.1f}% {100*tf/989:7.1f}%  {$mem:.1f} GiB (allocator peak)\")"
  done
done
# MoE (8 experts, top-1, every other layer) against the dense 124M model, GPU-resident, one round.
if [[ ${MOE:-1} == 1 ]]; then
  CHECK=0 ROUNDS=1 OUTDIR="$out/moe" bash "$root/bench/gpu_moe.sh" "$bin" || fails=$((fails + 1))
fi
echo "# failures: $fails"
exit $((fails > 0))
