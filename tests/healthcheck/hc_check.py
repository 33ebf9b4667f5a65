#!/usr/bin/env python3
"""Runs ib_healthcheck as a user would and checks what comes out.

hc_check.py [--rc N | --rc-nonzero] [--regex R]... [--not-regex R]... [--max-seconds S]
            [--json FILE [--unhealthy A,B | --unhealthy-count N] [--silent NODE]]
            [--file FILE --file-regex R] -- CMD...

--json checks the report's schema (docs/healthcheck.md) and which nodes it names: --unhealthy
gives the exact set ('' for none). The JSON file is deleted before the run, so a stale one
never passes."""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time


def check_schema(j, rc):
    for k in ["provenance", "profile", "mode", "nodes", "checks", "verdict", "unhealthy_nodes",
              "allocation_failures", "silent", "notes", "result", "exit_code"]:
        assert k in j, f"report lacks '{k}'"
    for k in ["tool", "version", "git", "date", "host", "profile", "checks"]:
        assert k in j["provenance"], f"provenance lacks '{k}'"
    assert j["provenance"]["tool"] == "ib_healthcheck"
    assert j["result"] in ("healthy", "unhealthy")
    assert j["exit_code"] == (0 if j["result"] == "healthy" else 1)
    if rc is not None:
        assert rc == j["exit_code"], f"exit code {rc} but the report says {j['exit_code']}"
    assert [v["node"] for v in j["verdict"]] == j["nodes"] + ["allocation"], "verdict rows != nodes + allocation"
    for v in j["verdict"]:
        assert set(v) == {"node", "verdict", "reasons"}, v
        assert (v["verdict"] == "UNHEALTHY") == (v["node"] in j["unhealthy_nodes"] or
                                                 (v["node"] == "allocation" and bool(j["allocation_failures"]))), v
    cols = {"node": {"node", "item", "value", "expected", "result", "note"},
            "p2p": {"metric", "pair", "size", "value", "unit", "limit", "result", "note"},
            "coll": {"size", "count", "time", "algbw", "busbw", "wrong", "limit", "result", "note"}}
    n = len(j["nodes"])
    for name, c in j["checks"].items():
        assert "rows" in c, f"check {name} lacks rows"
        kind = "node" if name == "node" else "p2p" if name.endswith("_p2p") else "coll"
        for r in c["rows"]:
            assert set(r) == cols[kind], f"{name} row has keys {sorted(r)}"
            assert r["result"] in ("PASS", "FAIL", "SKIP", "-"), r
        if kind == "coll" and c["rows"]:
            f = 2 * (n - 1) / n if name in ("allreduce", "nccl_allreduce") else (n - 1) / n
            assert abs(c["busbw_factor"] - f) < 1e-12, (name, c["busbw_factor"], f)
            for r in c["rows"]:
                if r["algbw"] is not None:
                    assert math.isclose(r["busbw"], r["algbw"] * f, rel_tol=1e-9), r
                    assert math.isclose(r["algbw"], r["size"] / (r["time"] * 1e-6) / 1e9, rel_tol=1e-6), r
    return j


ap = argparse.ArgumentParser()
ap.add_argument("--rc", type=int)
ap.add_argument("--rc-nonzero", action="store_true")
ap.add_argument("--regex", action="append", default=[])
ap.add_argument("--not-regex", action="append", default=[])
ap.add_argument("--max-seconds", type=float)
ap.add_argument("--json")
ap.add_argument("--unhealthy")
ap.add_argument("--unhealthy-count", type=int)
ap.add_argument("--silent")
ap.add_argument("--file")
ap.add_argument("--file-regex", action="append", default=[])
ap.add_argument("cmd", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
for f in (a.json, a.file):
    if f and os.path.exists(f):
        os.remove(f)
t0 = time.time()
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
secs = time.time() - t0
out = p.stdout
sys.stdout.write(out[-8000:])
print(f"--- exit code {p.returncode}, {secs:.1f} s")
fails = []
if a.rc is not None and p.returncode != a.rc:
    fails.append(f"exit code {p.returncode}, expected {a.rc}")
if a.rc_nonzero and p.returncode == 0:
    fails.append("exit code 0, expected an error")
if a.max_seconds and secs > a.max_seconds:
    fails.append(f"took {secs:.1f} s, more than {a.max_seconds} s")
for r in a.regex:
    if not re.search(r, out):
        fails.append(f"output lacks /{r}/")
for r in a.not_regex:
    if re.search(r, out):
        fails.append(f"output has /{r}/")
if a.json:
    try:
        j = check_schema(json.load(open(a.json)), a.rc)
        if a.unhealthy is not None:
            want = sorted(x for x in a.unhealthy.split(",") if x)
            assert sorted(j["unhealthy_nodes"]) == want, f"unhealthy nodes {j['unhealthy_nodes']}, expected {want}"
        if a.unhealthy_count is not None:
            assert len(j["unhealthy_nodes"]) == a.unhealthy_count, j["unhealthy_nodes"]
        if a.silent is not None:
            assert [s["node"] for s in j["silent"]] == [a.silent], f"silent {j['silent']}, expected {a.silent}"
        print(f"json ok: result {j['result']}, unhealthy {j['unhealthy_nodes']}")
    except (AssertionError, OSError, ValueError, KeyError) as e:
        fails.append(f"json: {e!r}")
if a.file:
    try:
        text = open(a.file).read()
        for r in a.file_regex:
            if not re.search(r, text):
                fails.append(f"{a.file} lacks /{r}/ (has {text!r})")
    except OSError as e:
        fails.append(f"{a.file}: {e}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
