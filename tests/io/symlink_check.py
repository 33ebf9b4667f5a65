#!/usr/bin/env python3
"""nvme_bench in a shared scratch directory where someone planted a symbolic link at its data file's
predictable name (nvme_bench.<node>.<rank>.dat) pointing at a file of the user (issue 17, item 7):
the run refuses the link in one line and the target keeps its bytes. Before, the file was opened
O_CREAT|O_TRUNC through the link and the target truncated and overwritten.

symlink_check.py --nvme-bench BIN --dir DIR
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--nvme-bench", required=True)
ap.add_argument("--dir", required=True)
a = ap.parse_args()
shutil.rmtree(a.dir, ignore_errors=True)
os.makedirs(a.dir)
victim = os.path.join(a.dir, "precious.txt")
with open(victim, "w") as f:
    f.write("precious data\n")
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
os.symlink(victim, os.path.join(a.dir, f"nvme_bench.{node}.0.dat"))
p = subprocess.run([a.nvme_bench, "--path", a.dir, "--size", "8M", "--mode", "write", "--block-size", "1M", "--buffered"],
                   capture_output=True, text=True, timeout=120)
errs = [l for l in p.stderr.splitlines() if "error:" in l]
fails = []
if p.returncode != 1 or len(errs) != 1 or "is a symbolic link: refusing to write through it" not in errs[0]:
    fails.append(f"expected exit 1 and one line refusing the link, got {p.returncode}: {p.stderr[-500:]}")
if open(victim).read() != "precious data\n":
    fails.append("the link's target was overwritten")
print("\n".join(fails) or "ok: the planted link was refused and its target kept its bytes")
sys.exit(1 if fails else 0)
