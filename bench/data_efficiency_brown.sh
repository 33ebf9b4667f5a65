#!/usr/bin/env bash
# Sequence-length warmup against the baseline on real text: gpt-tiny on the bundled Brown corpus,
# 2 ranks, the same data order, iterations and learning-rate schedule; SLW grows the length from
# 16 to 128 tokens over ITERS/4 steps (DeepSpeed's fixed_linear, multiples of 8, legacy
# curriculum_learning block). Validation (always at full length) every EVAL iterations; prints
# each run's final validation loss, tokens and wall-clock, and the tokens and wall-clock each
# needed to first reach the baseline's final validation loss; scripts/plot_metrics.py draws both.
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
# shellcheck disable=SC2054  # 949,50,1 is one value
data=(--data-path "$root/data/brown_text_document" --vocab-file "$root/data/gpt2-vocab.json"
      --merge-file "$root/data/gpt2-merges.txt" --split 949,50,1)
common=(--train-iters "$iters" --log-interval 5 --eval-interval "$eval_every" --eval-iters 10 --seed 1234)
gpt=$root/build/apps/pretrain_gpt/pretrain_gpt

run() {  # name extra...
  local name=$1; shift
  rm -f "$out/$name.jsonl" "$out/$name.jsonl.discarded"
  echo "# $name: @gpt-tiny.args $* ($iters iterations)" >&2
  mpirun -np 2 "${mpiflags[@]}" "$gpt" "@$root/inputs/gpt-tiny.args" "${data[@]}" "${common[@]}" "$@" \
    --metrics-file "$out/$name.jsonl" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; exit 1; }
}
run baseline
run slw --deepspeed_config "$out/ds_config_slw.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def load(name):
    recs = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    t0 = min(r["wall_time"] for r in recs if "wall_time" in r)
    train = {r["iteration"]: r for r in recs if r.get("type") == "train"}
    evals = [(r["iteration"], r["val_loss"], r["wall_time"] - t0) for r in recs if r.get("type") == "eval"]
    return train, evals, json.load(open(f"{out}/{name}.json"))
runs = {n: load(n) for n in ("baseline", "slw")}
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
"$py" "$root/scripts/plot_metrics.py" "$out/baseline.jsonl" "$out/slw.jsonl" --label "baseline (seq 128)" \
  --label "SLW 16->128 over $((iters / 4)) steps" --title "gpt-tiny on Brown, 2 ranks, $iters iterations" \
  -o "$out/slw_vs_baseline_brown.png"
