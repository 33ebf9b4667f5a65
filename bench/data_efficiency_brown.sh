#!/usr/bin/env bash
# Data efficiency against the baseline on real text: gpt-tiny on the bundled Brown corpus, 2 ranks,
# the same data order, iterations and learning-rate schedule, four runs:
#   baseline;
#   slw: sequence-length warmup, 16 -> 128 tokens over ITERS/4 steps (DeepSpeed's fixed_linear,
#        multiples of 8, legacy curriculum_learning block);
#   ltd: random-LTD, layers 1-2 of 4 keep 32 -> 128 tokens over 7*ITERS/10 steps (multiples of 16,
#        data_efficiency.data_routing.random_ltd as Megatron-DeepSpeed's template writes it);
#   slw+ltd: both (the layers keep at most the step's length);
#   voc: curriculum by vocabulary rarity (analyze_data's index files; percentile 1 -> 100, fixed_root
#        2 over ITERS/2 steps, schedule-based clusters, the data_sampling block);
#   voc+ltd: that curriculum and random-LTD together (the paper's CL + LTD composition).
# Validation (always at full length, every token) every EVAL iterations; prints each run's final
# validation loss, tokens and wall-clock, and the tokens and wall-clock each needed to first reach
# the baseline's final validation loss; scripts/plot_metrics.py draws them. RUNS picks which to run
# (e.g. RUNS="voc"); the table and the plot take every run whose output is in OUT_DIR. SEED sets
# --seed (default 1234): the data order, the initialisation and the dropped tokens.
#
#   bench/data_efficiency_brown.sh [ITERS] [OUT_DIR]   defaults: 300, bench/out/data_efficiency_brown
# Needs a build in ./build and the data of scripts/fetch_data.sh in ./data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-300}
out=${2:-$root/bench/out/data_efficiency_brown}
eval_every=${EVAL:-25}
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$out"
cat > "$out/ds_config_slw.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
 "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 128,
   "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": $((iters / 4)), "difficulty_step": 8}}}
JSON
ltd_block='"data_efficiency": {"enabled": true, "data_routing": {"enabled": true, "random_ltd": {"enabled": true,
   "total_layer_num": 4, "random_ltd_layer_num": 2, "random_ltd_layer_id": [1, 2], "model_mask_name": "attention_mask",
   "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
   "random_ltd_schedule": {"min_value": 32, "max_value": 128, "schedule_type": "fixed_linear",
     "schedule_config": {"require_steps": '$((iters * 7 / 10))', "seq_per_step": 16}}}}}'
cat > "$out/ds_config_ltd.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0, $ltd_block}
JSON
cat > "$out/ds_config_slw_ltd.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
 "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 128,
   "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": $((iters / 4)), "difficulty_step": 8}},
 $ltd_block}
JSON
cat > "$out/ds_config_voc.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
 "data_efficiency": {"enabled": true, "seed": 1234, "data_sampling": {"enabled": true, "curriculum_learning": {
   "enabled": true, "data_cluster_path": "$out/clusters", "curriculum_metrics": {"vocab_rarity": {
     "index_to_sample_path": "$out/brown_vocab_rarity_index_to_sample",
     "index_to_metric_path": "$out/brown_vocab_rarity_index_to_metric",
     "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 1, "max_difficulty": 100,
     "schedule_type": "fixed_root", "schedule_config": {"total_curriculum_step": $((iters / 2)), "difficulty_step": 1,
     "root_degree": 2}}}}}}}
JSON
python3 - "$out" <<'PY'  # the curriculum's block and random-LTD's in one data_efficiency section
import json, sys
out = sys.argv[1]
voc, ltd = json.load(open(f"{out}/ds_config_voc.json")), json.load(open(f"{out}/ds_config_ltd.json"))
voc["data_efficiency"]["data_routing"] = ltd["data_efficiency"]["data_routing"]
json.dump(voc, open(f"{out}/ds_config_voc_ltd.json", "w"), indent=1)
PY
# shellcheck disable=SC2054  # 949,50,1 is one value
data=(--data-path "$root/data/brown_text_document" --vocab-file "$root/data/gpt2-vocab.json"
      --merge-file "$root/data/gpt2-merges.txt" --split 949,50,1)
common=(--train-iters "$iters" --log-interval 5 --eval-interval "$eval_every" --eval-iters 10 --seed "${SEED:-1234}")
gpt=$root/build/apps/pretrain_gpt/pretrain_gpt

run() {  # name extra...
  local name=$1; shift
  rm -f "$out/$name.jsonl" "$out/$name.jsonl.discarded"
  echo "# $name: @gpt-tiny.args $* ($iters iterations)" >&2
  mpirun -np 2 "${mpiflags[@]}" "$gpt" "@$root/inputs/gpt-tiny.args" "${data[@]}" "${common[@]}" "$@" \
    --metrics-file "$out/$name.jsonl" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; exit 1; }
}
runs=${RUNS:-baseline slw ltd slw+ltd}
for r in $runs; do
  case $r in
    baseline) run baseline ;;
    slw) run slw --deepspeed_config "$out/ds_config_slw.json" ;;
    ltd) run ltd --deepspeed_config "$out/ds_config_ltd.json" --random-ltd ;;
    slw+ltd) run slw_ltd --deepspeed_config "$out/ds_config_slw_ltd.json" --random-ltd ;;
    voc|voc+ltd)
      mpirun -np 2 "${mpiflags[@]}" "$root/build/apps/analyze_data/analyze_data" --metrics vocab_rarity \
        --output-prefix "$out/brown" "@$root/inputs/gpt-tiny.args" "${data[@]}" "${common[@]}" > "$out/analyze.log" 2>&1 ||
        { tail -20 "$out/analyze.log" >&2; exit 1; }
      if [[ $r == voc ]]; then run voc --deepspeed_config "$out/ds_config_voc.json" --data-efficiency-curriculum-learning
      else run voc_ltd --deepspeed_config "$out/ds_config_voc_ltd.json" --data-efficiency-curriculum-learning --random-ltd; fi ;;
    *) echo "unknown run '$r' (baseline, slw, ltd, slw+ltd, voc, voc+ltd)" >&2; exit 2 ;;
  esac
done
names=""
for n in baseline slw ltd slw_ltd voc voc_ltd; do [[ -f $out/$n.json ]] && names="$names $n"; done
python3 - "$out" $names <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
def load(name):
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    t0 = min(r["wall_time"] for r in recs if "wall_time" in r)
    train = {r["iteration"]: r for r in recs if r.get("type") == "train"}
    evals = [(r["iteration"], r["val_loss"], r["wall_time"] - t0) for r in recs if r.get("type") == "eval"]
    return train, evals, json.load(open(f"{out}/{name}.json"))
runs = {n: load(n) for n in names}
target = runs["baseline"][1][-1][1]
print(f"| run | final val loss | tokens | wall-clock s | tokens to reach {target:.4f} | wall-clock to reach it |")
print("|---|---|---|---|---|---|")
for n, (train, evals, s) in runs.items():
    hit = next(((it, w) for it, v, w in evals if v <= target), None)
    tok = train[hit[0]]["consumed_tokens"] if hit and hit[0] in train else None
    print(f"| {n} | {evals[-1][1]:.4f} | {s['consumed_tokens']} | {evals[-1][2]:.0f} | "
          f"{tok if tok is not None else 'not reached'} | {f'{hit[1]:.0f} s' if hit else 'not reached'} |")
PY
py=python3
python3 -c 'import matplotlib' 2>/dev/null || py=/usr/bin/python3
files=() labels=()
for n in $names; do
  files+=("$out/$n.jsonl")
  case $n in
    baseline) labels+=(--label "baseline (seq 128)") ;;
    slw) labels+=(--label "SLW 16->128 over $((iters / 4)) steps") ;;
    ltd) labels+=(--label "random-LTD 32->128 over $((iters * 7 / 10)) steps") ;;
    slw_ltd) labels+=(--label "SLW + random-LTD") ;;
    voc) labels+=(--label "vocab-rarity curriculum, percentile 1->100 over $((iters / 2)) steps") ;;
    voc_ltd) labels+=(--label "vocab-rarity curriculum + random-LTD") ;;
  esac
done
"$py" "$root/scripts/plot_metrics.py" "${files[@]}" "${labels[@]}" --title "gpt-tiny on Brown, 2 ranks, $iters iterations, seed ${SEED:-1234}" \
  -o "$out/data_efficiency_brown.png"
