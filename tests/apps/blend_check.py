#!/usr/bin/env python3
"""Data blends as Megatron writes them: --data-path W1 PREFIX1 W2 PREFIX2, and --train-data-path /
--valid-data-path instead of --split. (Each dataset's share of the samples is checked in
tests/io/test_blended_dataset.cpp; here, the runs.)

- a 0.7/0.3 blend of Brown and a second corpus the test tokenizes trains, and says so;
- a blended run stopped at iteration 3 and resumed gives the straight run's losses bitwise;
- --train-data-path 0.7 A 0.3 B with --valid-data-path B trains and evaluates on B;
- one-line errors: a weight without its prefix, --data-path with --train-data-path.

blend_check.py --gpt PRETRAIN_GPT --preprocess PREPROCESS_DATA --args FILE --data DIR --workdir DIR
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--preprocess", "--args", "--data", "--workdir")
a, check = c.args, c.check
tok = ["--vocab-file", os.path.join(a.data, "gpt2-vocab.json"), "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]
brown = os.path.join(a.data, "brown_text_document")
rng = random.Random(5)
words = "river stone garden market silver forest window doctor summer paper music yellow".split()
src = os.path.join(a.workdir, "other.jsonl")
with open(src, "w") as f:
    for _ in range(300):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))}) + "\n")
other = os.path.join(a.workdir, "other")
c.run([a.preprocess, "--input", src, "--output-prefix", other, *tok, "--append-eod"])
other += "_text_document"


def train(name, *extra, want=0):
    m = os.path.join(a.workdir, name + ".jsonl")
    p = c.run([a.gpt, "@" + a.args, *tok, "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
               "--log-interval", "1", "--eval-iters", "2", "--eval-interval", "1000", "--metrics-file", m, *extra], want=want)
    recs = [json.loads(x) for x in open(m)] if os.path.exists(m) else []
    return p, [r for r in recs if r.get("type") == "train"], [r for r in recs if r.get("type") == "eval"]


blend = ["--data-path", "0.7", brown, "0.3", other, "--split", "949,50,1"]
p, straight, _ = train("straight", *blend, "--train-iters", "6")
check("blended as Megatron's BlendableDataset" in p.stdout and len(straight) == 6,
      f"a 0.7/0.3 blend trains 6 iterations ({len(straight)}) and says it blends")
ck = os.path.join(a.workdir, "ckpt")
train("first_half", *blend, "--train-iters", "6", "--save", ck, "--exit-interval", "3")
_, second, _ = train("second_half", *blend, "--train-iters", "6", "--load", ck)
check([r["lm_loss"] for r in second] == [r["lm_loss"] for r in straight[3:]],
      f"resumed mid-blend: {[r['lm_loss'] for r in second]} equal the straight run's {[r['lm_loss'] for r in straight[3:]]}")

p, tr, ev = train("apart", "--train-data-path", "0.7", brown, "0.3", other, "--valid-data-path", other, "--train-iters", "4",
                  "--eval-interval", "4")
check(len(tr) == 4 and len(ev) == 1 and "> validation data: " + other in p.stdout,
      f"--train-data-path / --valid-data-path: {len(tr)} iterations, {len(ev)} evaluation on the validation blend")

pe = c.run([a.gpt, "@" + a.args, *tok, "--train-iters", "1", "--data-path", "0.7", brown, "0.3"], want=None)
c.one_line_error("a weight without its prefix", pe, "pretrain_gpt", ["--data-path", "weight/prefix pairs", "got 3 values"])
pe = c.run([a.gpt, "@" + a.args, *tok, "--train-iters", "1", "--data-path", brown, "--train-data-path", other], want=None)
c.one_line_error("--data-path with --train-data-path", pe, "pretrain_gpt", ["--train-data-path", "both name the training data"])
c.finish()
