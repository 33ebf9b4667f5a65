#!/usr/bin/env python3
"""finetune as a user runs it: a tiny GPT pretrained here on Brown for a few steps, then finetuned on
prompt/response JSON lines the test writes (reverse a short word list), loss on the responses only.

- it starts from the weights at iteration 0 (Megatron's --finetune) and the response loss falls;
- a second start of the same command, whose --save now holds a checkpoint (a requeued job),
  resumes that run instead of starting over;
- --eval-only on the finetuned checkpoint gives the run's final validation loss (1e-6 relative);
- --pack-examples: the packed validation loss equals the unpacked one (each example attends to
  itself only, positions from 0), packed training's response loss falls, a corpus is refused;
- --load-hf on the pretrained weights exported as a save_pretrained directory gives the same first
  losses as --load (the same weights through export and the loader: 1e-6 relative);
- the position table comes with the weights: pretrained with --max-position-embeddings 256 at
  --seq-length 128, finetuning (from --load or --load-hf) keeps its 256 rows, the export's config.json
  says n_positions 256, and the pretraining run resumes at --seq-length 256;
- one-line errors naming the flag or the file and line: a line without the response field, a model
  flag that disagrees with the weights, a position table or sequence length that does not fit,
  finetune without weights.

finetune_check.py --gpt PRETRAIN_GPT --finetune FINETUNE --tool HPCT_CKPT --args FILE --data DIR --workdir DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, write_reverse_task  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--finetune", "--tool", "--args", "--data", "--workdir")
a, check = c.args, c.check
tok = ["--vocab-file", os.path.join(a.data, "gpt2-vocab.json"), "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]
pre = os.path.join(a.workdir, "pretrained")
c.run([a.gpt, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), *tok, "--split", "949,50,1",
       "--train-iters", "10", "--eval-iters", "0", "--save", pre, "--save-interval", "10", "--max-position-embeddings", "256"])


def positions(ckpt):
    """The position-table rows a checkpoint's architecture records (hpct_ckpt list)."""
    out = c.run([a.tool, "list", ckpt]).stdout
    line = next((x for x in out.splitlines() if x.startswith("# architecture:")), "")
    return json.loads(line.split(":", 1)[1]).get("max_position_embeddings") if line else None


check(positions(pre) == 256, f"the pretrained checkpoint records 256 positions (got {positions(pre)})")
# Context extension: the same run resumed at twice the sequence length trains on, with a schedule
# of its own (12 iterations: --override-opt_param-scheduler, as a Megatron user would give).
longer = os.path.join(a.workdir, "longer.jsonl")
c.run([a.gpt, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), *tok, "--split", "949,50,1",
       "--train-iters", "12", "--eval-iters", "0", "--load", pre, "--seq-length", "256", "--micro-batch-size", "4",
       "--log-interval", "1", "--metrics-file", longer, "--override-opt_param-scheduler"])
lr = [json.loads(x) for x in open(longer)] if os.path.exists(longer) else []
lr = [r for r in lr if r.get("type") == "train" and r.get("iteration", 0) > 10]
check([r["iteration"] for r in lr] == [11, 12] and all(0 < r["lm_loss"] < 20 for r in lr),
      f"resumed at --seq-length 256 within the 256 positions: {[(r['iteration'], r['lm_loss']) for r in lr]}")

sft = os.path.join(a.workdir, "reverse.jsonl")
write_reverse_task(sft)


def finetune(name, *extra, iters=24, want=0, seq=32):
    """A finetuning run on the reverse task. At --seq-length 32 every example fits its sample (12 to
    20 tokens) at a quarter of the 128-token samples' cost; the packing checks take 128 (several
    examples to a sample)."""
    out = os.path.join(a.workdir, name)
    p = c.run([a.finetune, "@" + a.args, "--seq-length", str(seq), "--data-path", sft, *tok, "--split", "90,10,0",
               "--train-iters", str(iters),
               "--lr", "2e-3", "--lr-warmup-iters", "4", "--lr-decay-iters", "30", "--log-interval", "1", "--eval-interval", "1000",
               "--eval-iters", "2", "--metrics-file", out + ".jsonl", "--json", out + ".json", *extra], want=want)
    recs = [json.loads(line) for line in open(out + ".jsonl")] if os.path.exists(out + ".jsonl") else []
    return p, [r for r in recs if r.get("type") == "train"], (json.load(open(out + ".json")) if os.path.exists(out + ".json") else {})


ft = os.path.join(a.workdir, "ft")
p, tr, summ = finetune("ft", "--load", pre, "--save", ft, "--save-interval", "24")
check("starting from the weights of" in p.stdout and "iteration 0, fresh optimizer" in p.stdout,
      "the start line says it starts from the weights at iteration 0")
check(positions(os.path.join(ft, "iter_0000024.h5")) == 256, "finetuning at --seq-length 32 keeps the weights' 256 positions")
check(len(tr) == 24 and tr[0]["iteration"] == 1, f"24 steps from iteration 1 (got {[r['iteration'] for r in tr][:3]})")
if tr:
    first, last = sum(r["lm_loss"] for r in tr[:3]) / 3, sum(r["lm_loss"] for r in tr[-3:]) / 3
    check(last < first - 1.5, f"the response loss falls: {first:.3f} over the first 3 steps, {last:.3f} over the last 3")
final_val = summ.get("final_val_loss")

# A requeued job: --save holds a checkpoint now, so the same command resumes it.
p2, tr2, _ = finetune("ft_again", "--load", pre, "--save", ft, "--save-interval", "30", iters=30)
check("resuming this run from it" in p2.stdout and tr2 and tr2[0]["iteration"] == 25,
      f"a second start resumes its own checkpoint (first iteration {tr2[0]['iteration'] if tr2 else None})")

# --eval-only on the finetuned weights: the run's final validation loss.
pe, _, se = finetune("eval", "--load", os.path.join(ft, "iter_0000024.h5"), "--eval-only")
vals = [line for line in pe.stdout.splitlines() if "validation loss" in line]
check(bool(vals) and "iteration" not in "".join(line for line in pe.stdout.splitlines() if "consumed samples:" in line),
      f"--eval-only evaluates and trains nothing: {vals[-1] if vals else '(no validation line)'}")
if final_val is not None and se.get("final_val_loss") is not None:
    check(abs(se["final_val_loss"] - final_val) <= 1e-6 * abs(final_val),
          f"--eval-only's loss {se['final_val_loss']} is the run's final {final_val}")
else:
    check(False, f"validation losses in the summaries: run {final_val}, eval-only {se.get('final_val_loss')}")

# Packing (--pack-examples): several examples per sample, each with its own attention and positions.
# On 4 validation examples (--split 99,1,0 of 400: they fit one packed sample) evaluated 32 times
# over (--eval-iters 2 x 16: whole epochs packed and unpacked alike), the packed loss is the
# unpacked one: each example sees only itself (1e-5 relative: the same fp32 sums, other GEMM shapes).
ckpt = os.path.join(ft, "iter_0000024.h5")
_, _, sp = finetune("eval_plain", "--load", ckpt, "--eval-only", "--split", "99,1,0", seq=128)
pk, _, sk = finetune("eval_packed", "--load", ckpt, "--eval-only", "--split", "99,1,0", "--pack-examples", seq=128)
check("packed 396 training examples into" in pk.stdout and "attention and positions per example" in pk.stdout,
      "the start line says how the examples were packed")
lp, lk = sp.get("final_val_loss"), sk.get("final_val_loss")
check(lp is not None and lk is not None and abs(lk - lp) <= 1e-5 * abs(lp),
      f"packed validation loss {lk} equals the unpacked {lp}")
# Training packed: the same response loss falls, with many examples per step.
pt, trp, _ = finetune("ft_packed", "--load", pre, "--pack-examples", "--global-batch-size", "8", iters=12, seq=128)
if trp:
    first, last = sum(r["lm_loss"] for r in trp[:3]) / 3, sum(r["lm_loss"] for r in trp[-3:]) / 3
    check(last < first - 1.5, f"packed finetuning's response loss falls: {first:.3f} -> {last:.3f}")
else:
    check(False, "packed finetuning logged no iteration")
pc = c.run([a.finetune, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), *tok, "--load", pre,
            "--train-iters", "1", "--pack-examples"], want=None)
c.one_line_error("--pack-examples on a token corpus", pc, "finetune", ["--pack-examples", "prompt/response examples"])

# The same weights through Hugging Face's layout: the same first losses.
hf = os.path.join(a.workdir, "hf")
os.makedirs(hf)
c.run([a.tool, "export", pre, os.path.join(hf, "model.safetensors")])
hfc = json.load(open(os.path.join(hf, "config.json"))) if os.path.exists(os.path.join(hf, "config.json")) else {}
check(hfc.get("n_positions") == 256, f"the export's config.json has n_positions 256 (got {hfc.get('n_positions')})")
_, trh, _ = finetune("from_hf", "--load-hf", hf, iters=3)
_, trl, _ = finetune("from_load", "--load", pre, iters=3)
check(len(trh) == 3 and len(trl) == 3 and all(abs(x["lm_loss"] - y["lm_loss"]) <= 1e-6 * abs(y["lm_loss"]) for x, y in zip(trh, trl)),
      f"--load-hf and --load give the same losses: {[r['lm_loss'] for r in trh]} vs {[r['lm_loss'] for r in trl]}")

# One-line errors.
bad = os.path.join(a.workdir, "bad.jsonl")
with open(bad, "w") as f:
    f.write(json.dumps({"prompt": "a", "response": "b"}) + "\n" + json.dumps({"prompt": "a", "answer": "b"}) + "\n")
pb = c.run([a.finetune, "@" + a.args, "--data-path", bad, *tok, "--load", pre, "--train-iters", "1"], want=None)
c.one_line_error("a line without the response field", pb, "finetune", ["bad.jsonl:2", "'response'"])
pm = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--load", pre, "--train-iters", "1", "--num-layers", "2"], want=None)
c.one_line_error("a model flag that disagrees with the weights", pm, "finetune", ["--num-layers", "layers 4"])
pp = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--load", pre, "--train-iters", "1",
            "--max-position-embeddings", "128"], want=None)
c.one_line_error("a position table that differs from the weights'", pp, "finetune", ["--max-position-embeddings", "position table of 256"])
ps = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--load-hf", hf, "--train-iters", "1", "--seq-length", "512"], want=None)
c.one_line_error("a sequence longer than the weights' positions", ps, "finetune", ["--seq-length 512", "256 positions"])
pn = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--train-iters", "1"], want=None)
c.one_line_error("no weights to start from", pn, "finetune", ["--load"])
# Prompts that fill the sample (issue 47 item 7: this trained at loss 0, grad norm 0, exit 0): all of
# them refused, naming --seq-length; some of them trained with a warning that counts them.
long_prompt = " ".join(["word"] * 200)  # 200+ tokens, past --seq-length 128
all_long = os.path.join(a.workdir, "all_long.jsonl")
with open(all_long, "w") as f:
    for i in range(4):
        f.write(json.dumps({"prompt": long_prompt, "response": " yes"}) + "\n")
pl = c.run([a.finetune, "@" + a.args, "--data-path", all_long, *tok, "--load", pre, "--train-iters", "1", "--split", "100,0,0"],
           want=None)
c.one_line_error("only prompts longer than the sample", pl, "finetune", ["--seq-length 128", "none of the 4 training examples"])
some_long = os.path.join(a.workdir, "some_long.jsonl")
with open(some_long, "w") as f:
    for i in range(4):
        f.write(json.dumps({"prompt": long_prompt if i % 2 else "short", "response": " yes"}) + "\n")
pw = c.run([a.finetune, "@" + a.args, "--data-path", some_long, *tok, "--load", pre, "--train-iters", "1", "--split", "100,0,0"])
check("warning: 2 of 4 training examples keep no response token within --seq-length 128" in pw.stdout,
      f"some prompts longer than the sample: trained, with a warning that counts them: "
      f"{[l for l in pw.stdout.splitlines() if 'warning' in l]}")
long_valid = os.path.join(a.workdir, "long_valid.jsonl")
with open(long_valid, "w") as f:
    for i in range(4):  # --split 50,50,0: the two short ones train, the two long ones validate
        f.write(json.dumps({"prompt": long_prompt if i >= 2 else "short", "response": " yes"}) + "\n")
pv = c.run([a.finetune, "@" + a.args, "--data-path", long_valid, *tok, "--load", pre, "--train-iters", "2", "--split", "50,50,0",
            "--eval-interval", "1", "--eval-iters", "1"])
check("none of the validation examples keeps a response token" in pv.stdout and
      not any("valid" in l and " nan" in l.lower() for l in pv.stdout.splitlines()),
      f"validation examples without a target: no validation (not a nan loss): "
      f"{[l for l in pv.stdout.splitlines() if 'warning' in l or 'validation' in l][:3]}")
c.finish()
