#!/usr/bin/env python3
"""A full disk under the records never costs the training (issue 47, item 10).

full_disk_check.py --gpt PRETRAIN_GPT --args ARGS --workdir DIR

A 128 KiB tmpfs, 12 KiB of it free, holds the metrics file and the TensorBoard directory; the
checkpoints go elsewhere. Before, the first write that failed aborted the job (MPI_ABORT at iteration
18 of 200, nothing saved). Now: the run trains to its end and saves, the first failure of each
writer is one warning line, and the JSON summary lists the writers that stopped. Mounting needs
root (CAP_SYS_ADMIN): without it the test is skipped, saying why (exit 77).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--args", "--workdir")
a, check = c.args, c.check
fs = os.path.join(a.workdir, "full")
os.makedirs(fs)
m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", fs], capture_output=True, text=True)
if m.returncode != 0:
    print(f"SKIPPED: cannot mount a tmpfs here (needs root): {m.stderr.strip()}")
    sys.exit(77)
try:
    with open(os.path.join(fs, "filler"), "wb") as f:
        f.write(b"\0" * (116 * 1024))
    ckpt, summary = os.path.join(a.workdir, "ckpt"), os.path.join(a.workdir, "summary.json")
    p = subprocess.run([a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--num-layers", "1", "--micro-batch-size", "2",
                        "--global-batch-size", "2", "--train-iters", "40", "--log-interval", "1", "--eval-iters", "0",
                        "--lr-decay-iters", "40", "--metrics-file", os.path.join(fs, "metrics.jsonl"),
                        "--tensorboard-dir", os.path.join(fs, "tb"), "--save", ckpt, "--json", summary],
                       capture_output=True, text=True, timeout=300)
    warnings = [l for l in p.stderr.splitlines() if l.startswith("warning:") and "cannot be written" in l]
    check(p.returncode == 0 and os.path.exists(os.path.join(ckpt, "iter_0000040.h5")),
          f"the run trains to iteration 40 and saves (exit {p.returncode}): {p.stderr[-400:] if p.returncode else ''}")
    check(any("metrics file" in w for w in warnings) and len(warnings) == len(set(warnings)),
          f"the metrics file's failure is one warning line: {warnings}")
    stopped = json.load(open(summary)).get("records_stopped", []) if os.path.exists(summary) else []
    check(any("metrics.jsonl" in s for s in stopped), f"the summary lists the writers that stopped: {stopped}")
    lines = open(os.path.join(fs, "metrics.jsonl"), errors="replace").read().splitlines()
    check(len(lines) >= 2 and all(json.loads(l) for l in lines[:-1]),
          f"what was written before the disk filled is intact ({len(lines)} lines)")
finally:
    subprocess.run(["umount", fs])
c.finish()
