#!/usr/bin/env bash
# Supervised finetuning end to end: the tiny GPT pretrained on Brown (PRE_ITERS steps), finetuned
# with finetune on 3800 "Reverse: w1 w2 w3 =>" -> " w3 w2 w1" examples (2 to 4 of 30 words; loss on
# the responses), then asked the 200 held-out word lists it never saw, greedy: exact answers.
#   bench/sft_reverse.sh [FT_ITERS ...]     (default 600; several: one finetune run each)
# Environment: PRE_ITERS (default 300), OUT (default bench/out/sft_reverse), LR (default 1e-3),
# LORA_RANK (LoRA finetuning at that rank, alpha 2 x rank, on LORA_TARGETS, default the four
# linears; LORA_SAVE: --lora-modules-to-save; the adapters are merged into the base with hpct_ckpt merge-lora before the held-out
# prompts are asked), REUSE_PRETRAINED (keep OUT/pretrained from an earlier run), WORDS (the 30
# words the lists are drawn from, space separated; default 30 nouns, most of them rare in Brown).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
out=${OUT:-$root/bench/out/sft_reverse}
mkdir -p "$out"
mpiflags=(--oversubscribe)
if [[ $(id -u) -eq 0 ]]; then mpiflags+=(--allow-run-as-root); fi
tok=(--vocab-file "$root/data/gpt2-vocab.json" --merge-file "$root/data/gpt2-merges.txt")
python3 - "$out" "${WORDS:-}" <<'PY'
import json, random, sys
out = sys.argv[1]
r = random.Random(3)
words = (sys.argv[2] or "apple river stone house green music paper window garden yellow summer winter table doctor school water "
         "light market silver forest ocean mountain letter friend animal planet orange circle bridge castle").split()
seen, rows = set(), []
while len(rows) < 4000:
    w = tuple(r.sample(words, r.randint(2, 4)))
    if w not in seen:
        seen.add(w)
        rows.append(w)
with open(f"{out}/train.jsonl", "w") as f:
    for w in rows[:3800]:
        f.write(json.dumps({"prompt": "Reverse: " + " ".join(w) + " =>", "response": " " + " ".join(reversed(w))}) + "\n")
with open(f"{out}/held.txt", "w") as f:
    f.writelines("Reverse: " + " ".join(w) + " =>\n" for w in rows[3800:])
json.dump([" " + " ".join(reversed(w)) for w in rows[3800:]], open(f"{out}/held_answers.json", "w"))
PY
pre=${PRE_ITERS:-300}
lora=()
if [[ -n ${LORA_RANK:-} ]]; then
  lora=(--lora-rank "$LORA_RANK" --lora-alpha $((2 * LORA_RANK)) --lora-targets "${LORA_TARGETS:-qkv,proj,fc,fc2}")
  if [[ -n ${LORA_SAVE:-} ]]; then lora+=(--lora-modules-to-save "$LORA_SAVE"); fi
fi
if [[ -d $out/pretrained && -n ${REUSE_PRETRAINED:-} ]]; then
  echo "# reusing $out/pretrained"
else
rm -rf "$out/pretrained"
echo "# pretraining the tiny GPT on Brown for $pre steps"
mpirun -np 2 "${mpiflags[@]}" "$root/build/apps/pretrain_gpt/pretrain_gpt" @"$root/inputs/gpt-tiny.args" \
  --data-path "$root/data/brown_text_document" "${tok[@]}" --split 949,50,1 --train-iters "$pre" --log-interval 100 \
  --eval-interval "$pre" --eval-iters 5 --save "$out/pretrained" --save-interval "$pre" >"$out/pretrain.log" 2>&1
fi
for it in "${@:-600}"; do
  rm -rf "$out/ft_$it"
  start=$(date +%s)
  mpirun -np 2 "${mpiflags[@]}" "$root/build/apps/finetune/finetune" @"$root/inputs/gpt-tiny.args" --load "$out/pretrained" \
    --data-path "$out/train.jsonl" "${tok[@]}" --split 98,2,0 --train-iters "$it" --lr "${LR:-1e-3}" --lr-warmup-iters 20 \
    --log-interval 100 --eval-interval "$it" --eval-iters 4 --save "$out/ft_$it" --save-interval "$it" \
    --metrics-file "$out/ft_$it.jsonl" "${lora[@]}" >"$out/ft_$it.log" 2>&1
  secs=$(($(date +%s) - start))
  model="$out/ft_$it"
  if [[ ${#lora[@]} -gt 0 ]]; then
    grep "^> LoRA" "$out/ft_$it.log" || true
    rm -rf "$out/ft_${it}_merged"
    "$root/build/apps/hpct_ckpt/hpct_ckpt" merge-lora "$out/ft_$it" "$out/ft_${it}_merged" --base "$out/pretrained" >/dev/null
    model="$out/ft_${it}_merged"
  fi
  "$root/build/apps/generate/generate" --load "$model" --prompts-file "$out/held.txt" --temperature 0 \
    --max-new-tokens 8 --micro-batch-size 32 --json "$out/held_$it.json" >/dev/null
  python3 - "$out/held_$it.json" "$out/held_answers.json" "$it" "$secs" "$out/ft_$it.log" <<'PY'
import json, re, sys
got = [r["text"] for r in json.load(open(sys.argv[1]))["results"]]
want = json.load(open(sys.argv[2]))
val = re.findall(r"final validation loss ([0-9.]+)", open(sys.argv[5]).read())
ok = sum(g == w for g, w in zip(got, want))
print(f"finetune {sys.argv[3]} steps ({sys.argv[4]} s): {ok}/{len(want)} held-out prompts exact "
      f"({100 * ok / len(want):.1f}%), validation loss {val[-1] if val else '?'}")
PY
done
