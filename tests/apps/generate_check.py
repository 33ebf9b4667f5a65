#!/usr/bin/env python3
"""generate as a user runs it, on a tiny GPT trained here for a few steps on Brown (12: what is checked
holds for any weights; a short warm-up makes the distributions peaked, away from near-ties):

- greedy text with the key/value cache is the text without it (every position recomputed);
- sampling (temperature 0.9, top-k 50, top-p 0.95) is reproducible from --seed, does not depend on
  how many prompts are decoded together, and changes with the seed;
- the JSON has per prompt the prompt's ids (the tokenizer's), at most --max-new-tokens ids, each
  with a log-probability <= 0, and why it stopped; the text printed is the decoded ids;
- one-line errors naming the flag: a prompt longer than the model's positions, a tokenizer that is
  not the run's, text prompts for a model trained on --mock-data, --top-p 0, no --load;
- an MoE model (pretrain_moe, 4 experts, top-2 Residual-MoE, 8 steps on Brown): greedy with the
  cache is the text without it, and the JSON's log-probabilities are those of a distribution.

generate_check.py --gpt PRETRAIN_GPT --moe PRETRAIN_MOE --generate GENERATE --args FILE --data DIR --workdir DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--moe", "--generate", "--args", "--data", "--workdir")
a, fails = c.args, c.fails
vocab, merges = os.path.join(a.data, "gpt2-vocab.json"), os.path.join(a.data, "gpt2-merges.txt")


sh = c.run


ckpt = os.path.join(a.workdir, "ckpt")
sh([a.gpt, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", vocab,
    "--merge-file", merges, "--split", "949,50,1", "--train-iters", "12", "--lr-warmup-iters", "3", "--eval-iters", "0",
    "--log-interval", "10", "--save", ckpt, "--save-interval", "12"])
prompts = ["The jury said", "In the morning the", "He was"]


def gen(name, *extra):
    out = os.path.join(a.workdir, name + ".json")
    cmd = [a.generate, "--load", ckpt, "--max-new-tokens", "12", "--json", out]
    for pr in prompts:
        cmd += ["--prompt", pr]
    p = sh(cmd + list(extra))
    return p, (json.load(open(out)) if os.path.exists(out) else None)


p_cached, cached = gen("greedy", "--temperature", "0")
_, full = gen("greedy_no_cache", "--temperature", "0", "--no-kv-cache")
_, s1 = gen("sample_a", "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--seed", "7")
_, s2 = gen("sample_b", "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--seed", "7", "--micro-batch-size", "1")
_, s3 = gen("sample_c", "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--seed", "8")
if None in (cached, full, s1, s2, s3):
    fails.append("a generate run wrote no JSON")
else:
    ids = lambda j: [r["ids"] for r in j["results"]]
    if ids(cached) != ids(full):
        fails.append(f"greedy with the cache {ids(cached)} differs from without {ids(full)}")
    # The tokens of a briefly trained model repeat (" the the ..."), so the cache is held to the
    # log-probabilities too, position by position: the same fp32 sums through other GEMM shapes
    # (1e-4 absolute, on values of order 1-10); a cached key or position gone wrong moves them.
    lp = lambda j: [x for r in j["results"] for x in r["logprobs"]]
    if len(lp(cached)) != len(lp(full)) or any(abs(x - y) > 1e-4 for x, y in zip(lp(cached), lp(full))):
        fails.append(f"greedy log-probabilities with the cache {lp(cached)[:6]} differ from without {lp(full)[:6]}")
    if ids(s1) != ids(s2):
        fails.append("sampling with one seed differs between --micro-batch-size 8 and 1")
    if ids(s1) == ids(s3):
        fails.append("seeds 7 and 8 sampled the same tokens")
    if ids(s1) == ids(cached):
        fails.append("sampling at temperature 0.9 gave the greedy tokens for every prompt")
    for j in (cached, s1):
        for i, r in enumerate(j["results"]):
            if not 1 <= len(r["ids"]) <= 12 or len(r["logprobs"]) != len(r["ids"]):
                fails.append(f"prompt {i}: {len(r['ids'])} ids, {len(r['logprobs'])} log-probabilities")
            if any(lp > 1e-9 for lp in r["logprobs"]):
                fails.append(f"prompt {i}: a log-probability above 0: {r['logprobs']}")
            if r["stop"] not in ("eod", "max_new_tokens", "length"):
                fails.append(f"prompt {i}: stop '{r['stop']}'")
            if r["stop"] == "max_new_tokens" and len(r["ids"]) != 12:
                fails.append(f"prompt {i}: stopped for max_new_tokens after {len(r['ids'])}")
            if not r["prompt_ids"]:
                fails.append(f"prompt {i}: no prompt ids")
    # The greedy run's text is printed after its prompt.
    for i, r in enumerate(cached["results"]):
        if prompts[i] + r["text"] not in p_cached.stdout:
            fails.append(f"prompt {i}: printed text is not the prompt + {r['text']!r}")
    if "tokens/s (key/value cache)" not in p_cached.stdout:
        fails.append("no tokens/s line")
    print("greedy:", [r["text"] for r in cached["results"]])
    print("sampled:", [r["text"] for r in s1["results"]])


def one_line_error(name, cmd, needle):
    c.one_line_error(name, sh(cmd, want=None), "generate", [needle])


one_line_error("long prompt", [a.generate, "--load", ckpt, "--prompt", "word " * 200], "--prompt")
bad_merges = os.path.join(a.workdir, "merges_other.txt")
with open(merges) as f, open(bad_merges, "w") as g:
    g.write(f.read() + "\n")
one_line_error("other tokenizer", [a.generate, "--load", ckpt, "--prompt", "Hi", "--merge-file", bad_merges], "--merge-file")  # the file that differs is named
one_line_error("top-p 0", [a.generate, "--load", ckpt, "--prompt", "Hi", "--top-p", "0"], "--top-p")
one_line_error("no --load", [a.generate, "--prompt", "Hi"], "--load")
mock = os.path.join(a.workdir, "mock")
sh([a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--train-iters", "2", "--eval-iters", "0",
    "--save", mock, "--save-interval", "2"])
one_line_error("text prompt on a mock-data model", [a.generate, "--load", mock, "--prompt", "Hi"], "--prompt-ids")
p = sh([a.generate, "--load", mock, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--temperature", "0"])
if "(4 tokens, stop: max_new_tokens)" not in p.stdout:
    fails.append("--prompt-ids on a mock-data model did not generate 4 tokens")

# An MoE checkpoint: the decoder routes every token to its top-k experts (nothing dropped).
moe = os.path.join(a.workdir, "moe")
sh([a.moe, "@" + a.args, "--num-experts", "4", "--expert-interval", "2", "--topk", "2", "--mlp-type", "residual",
    "--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", vocab, "--merge-file", merges,
    "--split", "949,50,1", "--train-iters", "8", "--lr-warmup-iters", "3", "--eval-iters", "0", "--log-interval", "10",
    "--save", moe, "--save-interval", "8"])
outs = {}
for name, extra in (("moe_cached", []), ("moe_full", ["--no-kv-cache"])):
    out = os.path.join(a.workdir, name + ".json")
    sh([a.generate, "--load", moe, "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "10",
        "--temperature", "0", "--json", out] + extra)
    outs[name] = json.load(open(out)) if os.path.exists(out) else None
if None in outs.values():
    fails.append("MoE: a generate run wrote no JSON")
else:
    mc, mf = ([r["ids"] for r in outs[k]["results"]] for k in ("moe_cached", "moe_full"))
    c.check(mc == mf and all(len(i) >= 1 for i in mc),
            f"MoE (top-2 residual): greedy with the cache equals without it ({mc})")
    lc, lf = ([x for r in outs[k]["results"] for x in r["logprobs"]] for k in ("moe_cached", "moe_full"))
    c.check(len(lc) == len(lf) and all(abs(x - y) <= 1e-4 for x, y in zip(lc, lf)),
            f"MoE: the same log-probabilities with the cache and without (1e-4): {lc[:4]} vs {lf[:4]}")
    lps = [lp for r in outs["moe_cached"]["results"] for lp in r["logprobs"]]
    c.check(lps and all(lp <= 1e-9 for lp in lps), f"MoE: log-probabilities <= 0 ({lps[:4]} ...)")
c.finish()
