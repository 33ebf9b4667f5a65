#!/usr/bin/env python3
"""Text that is not valid UTF-8 never fails a JSON we write (issue 47, item 6).

utf8_check.py --gpt PRETRAIN_GPT --generate GENERATE --args ARGS --data DIR --workdir DIR

- `generate --json` at temperature 5: byte-level BPE samples cut characters; every prompt failed
  with an unnamed [json.exception.type_error.316]. Now exit 0, valid JSON, the cut bytes as U+FFFD
  in "text" (the token ids stay exact).
- A --save, --json and --metrics-file path holding a 0xFF byte: the run trained and then failed at
  its first save, writing nothing. Now it saves, writes both records, and resumes from that path.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--generate", "--args", "--data", "--workdir")
a, check = c.args, c.check
vocab, merges = os.path.join(a.data, "gpt2-vocab.json"), os.path.join(a.data, "gpt2-merges.txt")
small = ["--micro-batch-size", "2", "--global-batch-size", "2", "--num-layers", "1", "--eval-iters", "0", "--lr-decay-iters", "10"]

# Paths with a byte that is not UTF-8 (os.fsencode keeps it as the raw byte).
w = os.fsencode(a.workdir)
ckpt, summary, metrics = w + b"/ck\xff", w + b"/sum\xff.json", w + b"/met\xff.jsonl"
p = subprocess.run([os.fsencode(a.gpt), b"@" + os.fsencode(a.args), b"--mock-data", b"--vocab-size", b"512",
                    *[x.encode() for x in small], b"--train-iters", b"2", b"--save", ckpt, b"--json", summary,
                    b"--metrics-file", metrics], capture_output=True, timeout=300)
check(p.returncode == 0 and os.path.exists(ckpt + b"/latest"),
      f"a run whose paths hold 0xFF saves (exit {p.returncode}): {p.stdout[-300:] + p.stderr[-300:]}")
for f in (summary, metrics):
    ok = False
    try:
        lines = open(f, encoding="utf-8").read()
        ok = all(json.loads(l) is not None for l in lines.splitlines() if l.strip()) if f == metrics else json.loads(lines)
    except Exception as e:  # noqa: BLE001
        print(e)
    check(bool(ok), f"{os.fsdecode(f)!r} is valid UTF-8 JSON")
p = subprocess.run([os.fsencode(a.gpt), b"@" + os.fsencode(a.args), b"--mock-data", b"--vocab-size", b"512",
                    *[x.encode() for x in small], b"--train-iters", b"3", b"--load", ckpt, b"--save", ckpt],
                   capture_output=True, timeout=300)
check(p.returncode == 0 and b"at iteration 2" in p.stdout, f"and resumes from that path (exit {p.returncode})")

# generate --json at temperature 5 on a model of GPT-2 tokens.
model = os.path.join(a.workdir, "model")
c.run([a.gpt, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", vocab,
       "--merge-file", merges, *small, "--train-iters", "1", "--save", model], timeout=300)
out = os.path.join(a.workdir, "gen.json")
prompts = [x for i in range(16) for x in ("--prompt", f"Sample {i}:")]
p = subprocess.run([a.generate, "--load", model, *prompts, "--temperature", "5", "--max-new-tokens", "64", "--seed", "7",
                    "--json", out], capture_output=True, text=True, errors="replace", timeout=300)
doc = None
try:
    doc = json.load(open(out, encoding="utf-8"))
except Exception as e:  # noqa: BLE001
    print(e)
texts = json.dumps(doc) if doc else ""
check(p.returncode == 0 and doc is not None, f"generate --json at temperature 5 exits 0 with valid JSON (exit {p.returncode}): "
                                             f"{p.stderr[-300:]}")
check("\\ufffd" in texts or "\ufffd" in texts,
      "some sampled text cut a character (seed 7), written as U+FFFD: the case that failed is exercised")
c.finish()
