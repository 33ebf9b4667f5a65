#!/usr/bin/env python3
"""A run started again after it finished (a requeued job, a rerun script) trains no step and saves
nothing: its checkpoint has reached --train-iters, or --train-tokens (which used to train one more
step and write another checkpoint). It says so, exits 0, and its JSON summary's exit_reason is
"already_complete".

finished_run_check.py --gpt PRETRAIN_GPT --workdir DIR
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from checklib import Checks  # noqa: E402

c = Checks("--gpt", "--workdir")
a = c.args
base = ["--mock-data", "--vocab-size", "300", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--eval-iters", "0",
        "--log-interval", "1"]
for name, limit in (("iters", ["--train-iters", "3"]), ("tokens", ["--train-iters", "100", "--train-tokens", "64"])):
    d = os.path.join(a.workdir, name)
    run = [a.gpt, *base, *limit, "--save", d, "--load", d]
    c.run(run)
    before = sorted(os.listdir(d))
    summary = os.path.join(a.workdir, name + ".json")
    p = c.run(run + ["--json", summary])
    c.check("> nothing to train" in p.stdout and " iteration " not in p.stdout.replace("at iteration", ""),
            f"{name}: the rerun says so and trains no step")
    c.check(sorted(os.listdir(d)) == before, f"{name}: no new checkpoint ({before} -> {sorted(os.listdir(d))})")
    s = json.load(open(summary)) if os.path.exists(summary) else {}
    c.check(s.get("exit_reason") == "already_complete", f"{name}: exit_reason {s.get('exit_reason')}")
c.finish()
