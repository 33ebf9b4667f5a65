#!/usr/bin/env bash
# On a GPU node: pretrain_moe --device cuda against the CPU backend (tests/apps/cuda_moe_check.py),
# then MoE vs dense tokens/s on the GPU with equal active parameters per token, alternated.
#
#   bench/gpu_moe.sh [BIN]      BIN: a folder holding pretrain_gpt and pretrain_moe (default: ./build)
# Environment: ROUNDS (default 2), EXPERTS (default 8), ITERS timed steps (default 3) after WARM
# (default 2), ACCUM micro-batches per step (default 4), OUTDIR (default bench/out/gpu_moe),
# MODE resident (default: GPU-resident ZeRO stage 1) or offload (stage 2, the optimizer on the
# host), CHECK=0 leaves out the correctness check (bench/gpu_train.sh runs test_gpt_cuda instead).
#
# The shape is GPT-2 124M (12 layers, hidden 768, 1024 tokens, micro-batch 8) in bf16; the MoE
# model replaces every other MLP with EXPERTS experts, top-1, capacity factor 1 (DeepSpeed-MoE's
# defaults), EP 1, its gate on the device. Tokens/s and the trainer's timers are medians of the
# timed steps; the MoE model has EXPERTS/2 + 1/2 times the MLP parameters, which the optimizer steps
# every iteration.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-}
b() { if [[ -n "$bin" ]]; then echo "$bin/$1"; else find "$root/build" -name "$1" -type f -perm -u+x | head -1; fi; }
out=${OUTDIR:-$root/bench/out/gpu_moe}
mkdir -p "$out"
rounds=${ROUNDS:-2} experts=${EXPERTS:-8} iters=${ITERS:-3} warm=${WARM:-2} accum=${ACCUM:-4} mode=${MODE:-resident}
mpiflags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpiflags+=(--allow-run-as-root)
fails=0

if [[ ${CHECK:-1} == 1 ]]; then
echo "# pretrain_moe on the GPU against the CPU backend"
timeout 240 python3 "$root/tests/apps/cuda_moe_check.py" --moe "$(b pretrain_moe)" --workdir "$out/check" \
  --mpi "mpirun -np 2 ${mpiflags[*]}" >"$out/check.log" 2>&1
rc=$?
echo "pretrain_moe_device_cuda: exit $rc"; tail -8 "$out/check.log"
((rc != 0)) && fails=$((fails + 1))
fi

echo "# bf16 MoE vs dense on the GPU (GPT-2 124M base, $experts experts top-1 on every other layer; $mode)"
cfg="$out/$mode.json"
if [[ $mode == offload ]]; then
  echo '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' >"$cfg"
else
  echo '{"zero_optimization": {"stage": 1}}' >"$cfg"
fi
shape=(--mock-data --vocab-size 50304 --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024
       --micro-batch-size 8 --global-batch-size $((8 * accum)) --train-iters $((iters + warm)) --lr 1e-4
       --log-interval 1 --eval-iters 0 --bf16 --device cuda --deepspeed_config "$cfg")
one() {  # tag binary args...
  local tag=$1 exe=$2; shift 2
  rm -f "$out/$tag.jsonl" "$out/$tag.json"
  if ! timeout 200 "$exe" "${shape[@]}" "$@" --metrics-file "$out/$tag.jsonl" --json "$out/$tag.json" >"$out/$tag.log" 2>&1; then
    echo "$tag: failed"; tail -15 "$out/$tag.log"; fails=$((fails + 1)); return
  fi
  python3 - "$out/$tag.jsonl" "$out/$tag.json" "$warm" "$tag" <<'PY'
import json, statistics, sys
tr = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"][int(sys.argv[3]):]
med = lambda f: statistics.median(f(r) for r in tr)
tm = lambda k: med(lambda r: r["timers_ms"][k]["max"])
s = json.load(open(sys.argv[2]))
dev = s["memory_per_rank"]["device"]
mem = (dev["parameters_and_gradients"][0] + dev.get("optimizer_states", [0])[0] + dev["activations"][0]) / 2**30
print(f"{sys.argv[4]:<10} {s['parameters']/1e6:8.1f}M params {med(lambda r: r['tokens_per_second']):10.0f} tokens/s "
      f"{med(lambda r: r['tflops_per_rank']):6.1f} TFLOP/s  step {tm('iteration'):6.0f} ms = forward {tm('forward'):5.0f} "
      f"+ backward {tm('backward'):5.0f} + optimizer {tm('optimizer'):5.0f}  device {mem:.1f} GiB")
PY
}
for r in $(seq "$rounds"); do
  echo "round $r"
  one "dense_r$r" "$(b pretrain_gpt)"
  one "moe_r$r" "$(b pretrain_moe)" --num-experts "$experts" --expert-interval 2 --topk 1 --moe-loss-coeff 0.01
done
echo "# failures: $fails"
exit $((fails > 0))
