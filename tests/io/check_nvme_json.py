#!/usr/bin/env python3
"""Runs nvme_bench (possibly under mpiexec) and checks its exit code, output and --json file.

check_nvme_json.py --json FILE [--ranks N] [--loops N] [--engine E] [--tune FILE] [--cases N] [--regex R]... -- CMD...

Checks the JSON twin's schema; that every case has one entry per rank with distinct files; that
the aggregate is what the per-rank figures say (total bytes / slowest rank's seconds); that
latency percentiles are ordered; that verified cases verified; that each case lists one figure
per loop and reports the median one; and, with --tune, that the written aio block is the
configuration with the largest read + write bandwidth among the cases."""
import argparse
import json
import math
import re
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--json", required=True)
ap.add_argument("--ranks", type=int, default=1)
ap.add_argument("--cases", type=int)
ap.add_argument("--loops", type=int, default=1)
ap.add_argument("--engine", help="every case ran on this engine")
ap.add_argument("--tune")
ap.add_argument("--regex", action="append", default=[])
ap.add_argument("cmd", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
sys.stdout.write(p.stdout[-8000:])
errors = []
if p.returncode != 0:
    errors.append(f"exit code {p.returncode}")
for r in a.regex:
    if not re.search(r, p.stdout):
        errors.append(f"output lacks /{r}/")


def close(x, y, rel=1e-6):
    return abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)


try:
    doc = json.load(open(a.json))
    for k in ["provenance", "units", "cases", "result", "failures"]:
        assert k in doc, f"JSON lacks '{k}'"
    prov = doc["provenance"]
    for k in ["tool", "version", "git", "date", "host", "ranks", "size_per_rank"]:
        assert k in prov, f"provenance lacks '{k}'"
    assert prov["tool"] == "nvme_bench" and int(prov["ranks"]) == a.ranks, prov
    assert doc["result"] == "OK", doc["failures"]
    cases = doc["cases"]
    if a.cases is not None:
        assert len(cases) == a.cases, f"{len(cases)} cases, expected {a.cases}"
    for c in cases:
        for k in ["mode", "aio", "ranks", "bytes", "seconds", "bandwidth_MBps", "bandwidth_GBps", "iops",
                  "lat_p50_us", "lat_p99_us", "lat_p99_9_us", "cpu_seconds", "verified", "per_rank"]:
            assert k in c, f"case lacks '{k}': {c}"
        for k in ["block_size", "queue_depth", "intra_op_parallelism", "thread_count", "single_submit", "overlap_events"]:
            assert k in c["aio"], f"aio block lacks '{k}'"
        pr = c["per_rank"]
        assert len(pr) == a.ranks == c["ranks"], f"{len(pr)} per-rank entries for {a.ranks} ranks"
        assert len({r["file"] for r in pr}) == a.ranks, "ranks share a file"
        assert [r["rank"] for r in pr] == list(range(a.ranks))
        tot = sum(r["bytes"] for r in pr)
        slow = max(r["seconds"] for r in pr)
        assert tot == c["bytes"] and tot > 0, (tot, c["bytes"])
        assert close(c["seconds"], slow), (c["seconds"], slow)
        assert close(c["bandwidth_MBps"], tot / slow / 1e6), (c["bandwidth_MBps"], tot / slow / 1e6)
        for r in pr:
            assert close(r["bandwidth_MBps"], r["bytes"] / r["seconds"] / 1e6)
        lat = [c["lat_p50_us"], c["lat_p99_us"], c["lat_p99_9_us"]]
        if c["mode"] == "randread":
            assert all(x is not None and x > 0 for x in lat), f"randread without latency: {lat}"
            assert c["iops"] > 0 and close(c["iops"] * c["aio"]["block_size"] / 1e6, c["bandwidth_MBps"], 1e-3)
        if lat[0] is not None:
            assert lat[0] <= lat[1] <= lat[2], f"percentiles out of order: {lat}"
        if c["verified"] is not None:
            assert c["verified"] is True, c
        if a.engine:
            assert c["aio"]["engine"] == a.engine, f"case on {c['aio']['engine']}, expected {a.engine}"
        loops = c["loops_MBps"]
        assert len(loops) == a.loops == int(prov["loops"]), f"{len(loops)} loop figures, expected {a.loops}"
        assert close(c["bandwidth_MBps"], sorted(loops)[len(loops) // 2]), (c["bandwidth_MBps"], loops)
    print(f"json: {len(cases)} cases x {a.ranks} rank(s) consistent")
    if a.tune:
        block = json.load(open(a.tune))
        aio = block["aio"]
        sums = {}
        for c in cases:
            key = json.dumps({k: c["aio"][k] for k in sorted(c["aio"])})
            sums.setdefault(key, {})[c["mode"]] = c["bandwidth_MBps"]
        best = max((v["read"] + v["write"], k) for k, v in sums.items() if "read" in v and "write" in v)
        want = json.loads(best[1])
        for k in ["block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"]:
            assert aio[k] == want[k], f"tuned {k}={aio[k]}, best read+write has {want[k]}"
        assert aio["thread_count"] == aio["intra_op_parallelism"]
        assert doc["tune"]["config"] == aio
        print(f"tune: picked {aio} = best read+write {best[0]:.1f} MB/s")
except (AssertionError, KeyError, ValueError, OSError) as e:
    errors.append(f"{type(e).__name__}: {e}")

for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
