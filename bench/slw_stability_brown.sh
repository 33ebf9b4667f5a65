#!/usr/bin/env bash
# Sequence-length warmup's stability claim on real text (Li, Zhang, He 2022: SLW trains stably at a
# learning rate that makes the baseline spike): gpt-tiny on the bundled Brown corpus, 2 ranks, a
# high peak learning rate LR (default 6e-2, 60x gpt-tiny's 1e-3) reached after a WARMUP-step warmup,
# cosine to 1e-4 over ITERS, gradient clipping 1.0 as in the recipes; the baseline (128 tokens
# throughout) against SLW 16 -> 128 over ITERS/2 steps (legacy curriculum_learning block, multiples
# of 8), for each seed in SEEDS. Every iteration is logged; a spike is the train loss rising above
# the lowest loss seen so far: the script prints the largest rise, the iterations that rose more
# than 0.3 nats, and the final validation loss (full length), and plots the runs.
#
#   bench/slw_stability_brown.sh [ITERS] [LR] [OUT_DIR]   defaults: 100, 6e-2, bench/out/slw_stability_brown
#   SEEDS="1234 42" (default); GBS=16 global batch (samples of 128 tokens); WARMUP=5 LR warmup steps
#   LR_UNIT=tokens: the warmup and the decay count consumed tokens (the baseline's WARMUP and ITERS steps'
#   worth), as the DeepSpeed tutorial pairs with SLW, and every run stops at the baseline's tokens
#   (--train-tokens; SLW takes more iterations to get there)
#   MODEL=bench/gpt_bytes.args: another model (an args file; default inputs/gpt-tiny.args) with its
#   --seq-length as SLW's end; VOCAB=1024: Brown re-tokenized by bench/small_vocab_brown.py to that
#   many tokens (written to data/ once), so a small model is not mostly its LM head; MIN_LEN=16: SLW's start
#   EXTRA_ARGS="--log-optimizer-states-to-tensorboard": more pretrain_gpt flags for every run (that one
#   adds a column: Adam's variance norm, the paper's gauge of instability)
# Needs a build in ./build and the data of scripts/fetch_data.sh in ./data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-100}
lr=${2:-6e-2}
out=${3:-$root/bench/out/slw_stability_brown}
seeds=${SEEDS:-1234 42}
gbs=${GBS:-16}
warmup=${WARMUP:-5}
model=${MODEL:-$root/inputs/gpt-tiny.args}
min_len=${MIN_LEN:-16}
seq=$(awk '$1 == "--seq-length" {print $2}' "$model")
[[ -n $seq ]] || { echo "$model: no --seq-length line" >&2; exit 2; }
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$out"
cat > "$out/ds_config_slw.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
 "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": $min_len, "max_difficulty": $seq,
   "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": $((iters / 2)), "difficulty_step": 8}}}
JSON
# shellcheck disable=SC2054  # 949,50,1 is one value
data=(--data-path "$root/data/brown_text_document" --vocab-file "$root/data/gpt2-vocab.json"
      --merge-file "$root/data/gpt2-merges.txt" --split 949,50,1)
if [[ -n ${VOCAB:-} ]]; then
  small=$root/data/brown_v$VOCAB
  [[ -f ${small}_text_document.idx ]] || python3 "$root/bench/small_vocab_brown.py" --size "$VOCAB" \
    --data "$root/data/brown_text_document" --vocab "$root/data/gpt2-vocab.json" --out "$small"
  # shellcheck disable=SC2054  # 949,50,1 is one value
  data=(--data-path "${small}_text_document" --vocab-file "$small-vocab.json" --merge-file "$small-merges.txt" --split 949,50,1)
fi
read -ra extra_args <<< "${EXTRA_ARGS:-}"
common=("${extra_args[@]}" --log-interval 1 --eval-interval "$iters" --eval-iters 10 --lr "$lr" --min-lr 1e-4 --global-batch-size "$gbs")
if [[ ${LR_UNIT:-iters} == tokens ]]; then
  step_tokens=$((gbs * seq))
  common+=(--train-iters $((iters * 2)) --train-tokens $((iters * step_tokens)) --lr-warmup-iters 0
           --lr-warmup-tokens $((warmup * step_tokens)) --lr-decay-tokens $((iters * step_tokens)))
else
  common+=(--train-iters "$iters" --lr-warmup-iters "$warmup")
fi
gpt=$root/build/apps/pretrain_gpt/pretrain_gpt
names=()
n_runs=$(( $(wc -w <<< "$seeds") * 2 )) done_runs=0 t0=$SECONDS
for seed in $seeds; do
  for arm in baseline slw; do
    name=${arm}_seed$seed
    extra=()
    [[ $arm == slw ]] && extra=(--deepspeed_config "$out/ds_config_slw.json")
    rm -f "$out/$name.jsonl" "$out/$name.jsonl.discarded"
    eta=""
    if (( done_runs > 0 )); then eta=", ETA $(( (SECONDS - t0) * (n_runs - done_runs) / done_runs )) s"; fi
    echo "# [$((done_runs + 1))/$n_runs] $name: lr $lr, global batch $gbs, $iters iterations${eta}" >&2
    mpirun -np 2 "${mpiflags[@]}" "$gpt" "@$model" "${data[@]}" "${common[@]}" --seed "$seed" \
      "${extra[@]}" --metrics-file "$out/$name.jsonl" --json "$out/$name.json" > "$out/$name.log" 2>&1 ||
      { tail -20 "$out/$name.log" >&2; exit 1; }
    names+=("$name")
    done_runs=$((done_runs + 1))
  done
done
python3 - "$out" "$lr" "${names[@]}" <<'PY'
import json, sys
out, lr, names = sys.argv[1], sys.argv[2], sys.argv[3:]
opt = any("optimizer" in json.loads(l) for n in names for l in open(f"{out}/{n}.jsonl"))
vcol = " Adam's variance L2: peak (at iteration), largest one-step growth (at iteration) |" if opt else ""
print(f"| run (peak lr {lr}) | largest rise above the running min (nats, at iteration) | iterations rising > 0.3 nats | final val loss |{vcol}")
print("|---|---|---|---|" + ("---|" if opt else ""))
for n in names:
    recs = [json.loads(l) for l in open(f"{out}/{n}.jsonl")]
    train = [(r["iteration"], r["lm_loss"]) for r in recs if r.get("type") == "train"]
    val = [r["val_loss"] for r in recs if r.get("type") == "eval"]
    low, worst, at, count = float("inf"), 0.0, 0, 0
    for it, loss in train:
        if loss - low > worst:
            worst, at = loss - low, it
        count += loss - low > 0.3
        low = min(low, loss)
    row = f"| {n} | {worst:.2f} (iteration {at}) | {count} | {val[-1]:.4f} |"
    if opt:  # the paper's gauge of instability: extreme values of Adam's variance (EXTRA_ARGS, in the header)
        v = [(r["iteration"], r["optimizer"]["variance_l2"]) for r in recs if r.get("type") == "train" and "optimizer" in r]
        peak = max(v, key=lambda p: p[1])
        jump = max(zip(v, v[1:]), key=lambda p: p[1][1] / p[0][1])
        row += f" {peak[1]:.3g} ({peak[0]}), {jump[1][1] / jump[0][1]:.1f}x ({jump[1][0]}) |"
    print(row)
PY
py=python3
python3 -c 'import matplotlib' 2>/dev/null || py=/usr/bin/python3
files=() labels=()
for n in "${names[@]}"; do files+=("$out/$n.jsonl"); labels+=(--label "$n"); done
"$py" "$root/scripts/plot_metrics.py" "${files[@]}" "${labels[@]}" \
  --title "$(basename "$model" .args) on Brown${VOCAB:+ (vocab $VOCAB)}, 2 ranks, batch $gbs, peak lr $lr after $warmup warmup steps${LR_UNIT:+ (in $LR_UNIT)}: baseline vs SLW $min_len->$seq over $((iters / 2)) steps" \
  -o "$out/slw_stability_brown.png"
