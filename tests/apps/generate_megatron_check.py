#!/usr/bin/env python3
"""generate with Megatron-DeepSpeed's generate_text.sh flags and batched samples:

- prompts piped on standard input (--sample-input-file -), --num-samples 2 each: the output file
  (--sample-output-file) has one JSON line per sample, in prompt order, the prompts' text as given,
  and a prompt's two samples drew from their own streams (different tokens);
- Megatron's spellings act as ours: --out-seq-length 5 --recompute gives the ids --max-new-tokens 5
  --no-kv-cache gives (greedy), and --top_k 1 at temperature 1 is greedy;
- unconditional samples: no prompt, --num-samples 3 --genfile: 3 lines, each starting from the
  end-of-document token, --out-seq-length tokens long unless finished.

generate_megatron_check.py --gpt PRETRAIN_GPT --generate GENERATE --data DIR --workdir DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--generate", "--data", "--workdir")
a, check = c.args, c.check
w = a.workdir
ck = os.path.join(w, "ckpt")
c.train_tiny_brown(a.gpt, a.data, ck, iters=2, batch=2, lr="1e-3")


def lines(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


out = os.path.join(w, "samples.jsonl")
p = subprocess.run([a.generate, "--load", ck, "--sample-input-file", "-", "--num-samples", "2", "--out-seq-length", "6",
                    "--sample-output-file", out], input="The jury said\n\nIn the city\n", capture_output=True, text=True)
s = lines(out)
check(p.returncode == 0 and [x["prompt"] for x in s] == ["The jury said"] * 2 + ["In the city"] * 2,
      f"stdin prompts x 2 samples in order: {[x['prompt'] for x in s]} (exit {p.returncode}) {p.stderr[-200:]}")
check(len(s) == 4 and s[0]["ids"] != s[1]["ids"] and s[2]["ids"] != s[3]["ids"] and all(len(x["ids"]) == x["length"] for x in s),
      "each sample draws from its own stream; ids and length agree")


def ids(*flags):
    j = os.path.join(w, "g.json")
    c.run([a.generate, "--load", ck, "--prompt", "The jury said", "--json", j, *flags])
    return json.load(open(j))["results"][0]["ids"] if os.path.exists(j) else None


greedy = ids("--max-new-tokens", "5", "--no-kv-cache", "--temperature", "0")
check(greedy is not None and len(greedy) == 5 and ids("--out-seq-length", "5", "--recompute", "--temperature", "0") == greedy,
      f"--out-seq-length / --recompute act as --max-new-tokens / --no-kv-cache ({greedy})")
check(ids("--max-new-tokens", "5", "--top_k", "1", "--top_p", "1.0") == greedy, "--top_k 1 is greedy")

gen = os.path.join(w, "uncond.jsonl")
c.run([a.generate, "--load", ck, "--num-samples", "3", "--genfile", gen, "--out-seq-length", "4"])
u = lines(gen)
check(len(u) == 3 and all(x["prompt"] == "<|endoftext|>" and (x["length"] == 4 or x["finished"]) for x in u),
      f"3 unconditional samples from <|endoftext|> ({[(x['prompt'], x['length']) for x in u]})")
c.finish()
