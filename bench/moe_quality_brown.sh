#!/usr/bin/env bash
# MoE vs dense quality on real text: gpt-tiny (dense) against moe-tiny (the same shape, 8 experts
# top-1 on every other layer, EP = 2), a residual MoE (the dense MLP beside one gated expert) and a
# tiny PR-MoE (pyramid: 4 experts on layer 2, 8 on layer 4, residual), on the bundled Brown corpus,
# same data order and iterations per seed; validation loss every EVAL iterations; then
# scripts/plot_metrics.py draws the first seed's runs. Prints each run's final validation loss,
# and per variant the mean over seeds and its difference from dense.
#
#   bench/moe_quality_brown.sh [ITERS] [OUT_DIR]      defaults: 400, bench/out/moe_quality_brown
#   SEEDS="1234 4321" VARIANTS="dense moe8 residual prmoe" (the defaults)
# Needs a build in ./build and the data of scripts/fetch_data.sh in ./data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${1:-400}
out=${2:-$root/bench/out/moe_quality_brown}
eval_every=${EVAL:-50}
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
mkdir -p "$out"
# shellcheck disable=SC2054  # 949,50,1 is one value
data=(--data-path "$root/data/brown_text_document" --vocab-file "$root/data/gpt2-vocab.json"
      --merge-file "$root/data/gpt2-merges.txt" --split 949,50,1)
read -r -a seeds <<<"${SEEDS:-1234 4321}"
read -r -a variants <<<"${VARIANTS:-dense moe8 residual prmoe}"
common=(--train-iters "$iters" --log-interval 10 --eval-interval "$eval_every" --eval-iters 10)

run() {  # name binary args-file extra...
  local name=$1 bin=$2 args=$3; shift 3
  rm -f "$out/$name.jsonl" "$out/$name.jsonl.discarded"
  echo "# $name: $(basename "$bin") @$(basename "$args") $* ($iters iterations)" >&2
  mpirun -np 2 "${mpiflags[@]}" "$bin" "@$args" "${data[@]}" "${common[@]}" "$@" \
    --metrics-file "$out/$name.jsonl" --json "$out/$name.json" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; exit 1; }
  python3 - "$out/$name.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("%s: final validation loss %.4f, perplexity %.1f, %.0f tokens/s"
      % (sys.argv[2], s["final_val_loss"], s["final_val_ppl"], s["tokens_per_second"]))
PY
}
gpt="$root/build/apps/pretrain_gpt/pretrain_gpt" moe="$root/build/apps/pretrain_moe/pretrain_moe"
for seed in "${seeds[@]}"; do
  for v in "${variants[@]}"; do
    case "$v" in
      dense) run "dense_s$seed" "$gpt" "$root/inputs/gpt-tiny.args" --seed "$seed" ;;
      moe8) run "moe8_s$seed" "$moe" "$root/inputs/moe-tiny.args" --moe-expert-parallel-size 2 --seed "$seed" ;;
      residual) run "residual_s$seed" "$moe" "$root/inputs/moe-tiny.args" --moe-expert-parallel-size 2 --mlp-type residual \
        --seed "$seed" ;;
      prmoe) run "prmoe_s$seed" "$moe" "$root/inputs/moe-tiny.args" --moe-expert-parallel-size 2 --mlp-type residual \
        --num-experts 4 8 --seed "$seed" ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
  done
done
python3 - "$out" "${#seeds[@]}" "${variants[@]}" -- "${seeds[@]}" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
rest = sys.argv[3:]
variants, seeds = rest[:rest.index("--")], rest[rest.index("--") + 1:]
final = {v: [json.load(open(f"{out}/{v}_s{s}.json"))["final_val_loss"] for s in seeds] for v in variants}
base = statistics.mean(final["dense"]) if "dense" in final else None
for v in variants:
    m = statistics.mean(final[v])
    d = f", {m - base:+.4f} vs dense" if base is not None and v != "dense" else ""
    print(f"{v}: final validation loss per seed {[round(x, 4) for x in final[v]]}, mean {m:.4f}{d}")
PY
py=python3
python3 -c 'import matplotlib' 2>/dev/null || py=/usr/bin/python3
runs=() labels=()
declare -A label=([dense]="dense (gpt-tiny)" [moe8]="MoE 8 experts top-1, EP 2" [residual]="residual MoE (MLP + 1 of 8 experts)"
                  [prmoe]="PR-MoE (4, 8 experts, residual)")
for v in "${variants[@]}"; do runs+=("$out/${v}_s${seeds[0]}.jsonl"); labels+=(--label "${label[$v]}"); done
"$py" "$root/scripts/plot_metrics.py" "${runs[@]}" "${labels[@]}" \
  --title "Brown corpus, 2 ranks, $iters iterations, seed ${seeds[0]}" -o "$out/moe_vs_dense_brown.png"
echo "plot: $out/moe_vs_dense_brown.png" >&2
