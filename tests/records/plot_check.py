#!/usr/bin/env python3
"""End-to-end check of scripts/plot_metrics.py and scripts/hpct_metrics.py on a metrics file: the
PNG is written and is a real PNG of a sensible size, the plot drew one point per stitched train
record and one learning rate per iteration the train records' "learning_rates" cover, and
`hpct_metrics.py --stitch` writes each iteration once, in increasing order. Not a check of what
the curves look like (look at the PNG for that).

    plot_check.py METRICS OUT.png     # METRICS: a file, or a run's segment files joined by commas
    plot_check.py --synthetic DIR     # writes synthetic runs into DIR and checks those, including
                                      # the exact iterations the stitching rule must keep

Prints "ok   ..." / "FAIL ..." lines and "N failed"; exit status 1 when any check failed. Runs the
tools with the first of this interpreter and /usr/bin/python3 that has matplotlib (Debian's
python3-matplotlib, scripts/install_deps.sh, lives in the system interpreter, which may not be the
one running this script, e.g. under pyenv).
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.normpath(os.path.join(HERE, "..", "..", "scripts"))
sys.path.insert(0, SCRIPTS)
import hpct_metrics  # noqa: E402
import plot_metrics  # noqa: E402  (matplotlib is imported only when plotting)

FAILS = []
PY = None  # the interpreter that runs the tools: set in main()


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAILS.append(msg)
    return cond


def run_tool(script, *args):
    p = subprocess.run([PY, os.path.join(SCRIPTS, script), *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def png_size(path):
    """(width, height) from the IHDR chunk, or None when `path` is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def check_file(metrics, out_png):
    """All checks on one run (a path, or segment paths joined by commas). Returns the stitched Run."""
    name = os.path.basename(out_png)
    try:
        run = hpct_metrics.load_run(hpct_metrics.split_run_arg(metrics))
    except hpct_metrics.MetricsError as e:
        check(False, f"{metrics} loads: {e}")
        return None
    if os.path.exists(out_png):
        os.remove(out_png)
    rc, out, err = run_tool("plot_metrics.py", metrics, "-o", out_png, "--segments")
    if not check(rc == 0, f"plot_metrics.py exits 0 for {metrics} (rc {rc}) {err.strip()[-300:]}"):
        return run
    lines = out.splitlines()
    check(bool(lines) and lines[0] == out_png, f"plot_metrics.py prints the PNG path first ({lines[:1]})")
    size = png_size(out_png) if os.path.isfile(out_png) else None
    check(size is not None, f"{name} exists and starts with the PNG signature and IHDR")
    if size:
        check(size[0] > 300 and size[1] > 300, f"{name} is {size[0]}x{size[1]} pixels (> 300 each way)")
    m = re.search(r": (\d+) train points, (\d+) eval points, (\d+) segments? \((\d+) train records\), "
                  r"(\d+) learning-rate points", out)
    if check(m is not None, "plot_metrics.py prints the points drawn"):
        drawn = int(m.group(1))
        with_loss = sum(1 for r in run.train if hpct_metrics._is_num(r.data.get("lm_loss")))
        check(drawn == with_loss, f"train points drawn ({drawn}) = stitched train records with a loss ({with_loss})")
        check(int(m.group(4)) == len(run.train), f"train records reported ({m.group(4)}) = stitched ({len(run.train)})")
        check(int(m.group(3)) == len(run.segments), f"segments reported ({m.group(3)}) = stitched ({len(run.segments)})")
        # One learning rate per iteration each train record covers: the whole list where it has
        # one (iterations after the kept record before it), else its logged rate.
        want, prev, bad = 0, 0, []
        for r in run.train:
            rates, it = r.data.get("learning_rates"), r.data["iteration"]
            if isinstance(rates, list) and not (0 < len(rates) <= it - prev and rates[-1] == r.data.get("learning_rate")):
                bad.append(f"{it}: {len(rates)} rates after the record at {prev}")
            want += len(rates) if isinstance(rates, list) else 1
            prev = it
        check(not bad, f"each learning_rates list covers iterations after the record before it and ends with "
                       f"learning_rate {bad[:3]}")
        check(int(m.group(5)) == want, f"learning-rate points drawn ({m.group(5)}) = iterations the train records cover ({want})")

    stitched = os.path.splitext(out_png)[0] + ".stitched.jsonl"
    rc, out, err = run_tool("hpct_metrics.py", *hpct_metrics.split_run_arg(metrics), "--stitch", stitched, "--summary")
    if not check(rc == 0, f"hpct_metrics.py --stitch exits 0 (rc {rc}) {err.strip()[-300:]}"):
        return run
    check(len([l for l in out.splitlines() if re.match(r"\d+ ", l)]) == len(run.segments),
          "--summary prints one line per segment")
    recs = [json.loads(l) for l in open(stitched) if l.strip()]
    for kind in ("train", "eval"):
        its = [r["iteration"] for r in recs if r.get("type") == kind]
        ok = all(a < b for a, b in zip(its, its[1:]))
        check(ok, f"stitched {kind} iterations appear once each, increasing ({len(its)} records)")
    segs = [r for r in recs if r.get("type") == "segment"]
    check([s["segment"] for s in segs] == list(range(1, len(run.segments) + 1)),
          f"stitched file has segment records 1..{len(run.segments)}")
    again = hpct_metrics.load_run([stitched])
    check([r.data["iteration"] for r in again.train] == [r.data["iteration"] for r in run.train] and again.dropped == 0,
          "the stitched file reads back to the same iterations with nothing to drop")
    return run


# ---- synthetic runs ----------------------------------------------------------------------------

T0 = 1_790_000_000.0  # a unix time; only differences matter


def _seg(k, r, wall, ckpt, hosts=("n1", "n2")):
    return {"type": "segment", "segment": k, "resumed_from_iteration": r, "checkpoint": ckpt,
            "wall_time": wall, "time": "2026-11-24T10:00:00Z", "app": "pretrain_gpt", "version": "0.1.0",
            "git_commit": f"c0ffee{k}", "hosts": list(hosts), "world_size": len(hosts),
            "layout": {"data_parallel": len(hosts), "expert_parallel": 1, "zero_stage": 1},
            "config": {"train_iters": 40, "log_interval": 2}, "discarded_records": 0, "discarded_file": None}


def _lr(i):
    """The synthetic runs' learning rate at iteration i: warmup to 10, cosine decay to 1e-4 at 40
    (a curve, so rates at log lines joined by straight lines are not it)."""
    if i <= 10:
        return 1e-3 * i / 10
    return 1e-4 + 0.5 * (1 + math.cos(math.pi * min(1.0, (i - 10) / 30))) * 9e-4


def _train(i, wall, seg, new_format=True, prev=None):
    """A train record of iteration i; a new-format one carries the rates of prev + 1 .. i."""
    tps = 4096.0 / (1.0 + 0.05 * seg)
    r = {"type": "train", "iteration": i, "consumed_samples": 32 * i, "consumed_tokens": 32 * 128 * i,
         "elapsed_ms_per_iteration": 1000.0, "learning_rate": _lr(i), "global_batch_size": 32,
         "lm_loss": 2.0 + 8.0 * math.exp(-i / 12) + 0.01 * seg, "loss_scale": 1.0, "grad_norm": 1.0 / (1 + i),
         "skipped_iterations": 0, "nan_iterations": 0, "tokens_per_second": tps, "tokens_per_second_per_rank": tps / 2,
         "tflops_per_rank": 0.5 + 0.01 * seg}
    if new_format:
        r["learning_rates"] = [_lr(j) for j in range((i - 1 if prev is None else prev) + 1, i + 1)]  # one per iteration
        r["wall_time"] = wall
        r["memory"] = {"peak_rss_bytes": (1.5 + 0.02 * i) * (1 << 30)}
        r["timers_ms"] = {"forward": 300.0, "backward": 600.0, "grad_reduce": 50.0, "optimizer": 50.0}
    return r


def _eval(i, wall, new_format=True):
    r = {"type": "eval", "iteration": i, "val_loss": 2.1 + 8.0 * math.exp(-i / 12)}
    r["val_ppl"] = math.exp(r["val_loss"])
    if new_format:
        r["wall_time"] = wall
    return r


def _segment_records(k, r, last, t_start, new_format, with_summary, log_every=2):
    """Records of one segment resumed from r, logging every log_every iterations up to last, 1 s
    each, 5 s of start-up; evaluation every 10."""
    recs = [_seg(k, r, t_start, None if r == 0 else f"ckpt/iter_{r:07d}.h5")] if new_format else []
    t = t_start + 5.0
    prev = r  # the iteration of the segment's last train record: its learning_rates start after it
    for i in range(r + 1, last + 1):
        t += 1.0
        if i % log_every == 0:
            recs.append(_train(i, t, k, new_format, prev))
            prev = i
        if i % 10 == 0:
            t += 0.5
            recs.append(_eval(i, t, new_format))
    if with_summary:
        recs.append({"type": "summary", "iterations": last, "start_iteration": r, "tokens_per_second": 4000.0,
                     "exit_reason": "done"})
    return recs, t


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def synthetic(d):
    os.makedirs(d, exist_ok=True)
    # Segment 1 runs to 20 and is killed (no summary); its last checkpoint was 14. Segment 2 resumes
    # from 14 and ends at 30 with a summary; segment 3 resumes from 26 (a checkpoint older than 30)
    # and finishes at 40. Records above each resume point stay in the file, as an older trainer
    # would leave them: the stitcher must drop them.
    s1, t1 = _segment_records(1, 0, 20, T0, True, False)
    s2, t2 = _segment_records(2, 14, 30, t1 + 3600.0, True, True)
    s3, _ = _segment_records(3, 26, 40, t2 + 7200.0, True, True)
    path = os.path.join(d, "synthetic_3seg.jsonl")
    write_jsonl(path, s1 + s2 + s3)
    run = check_file(path, os.path.join(d, "synthetic_3seg.png"))
    if run:
        want = list(range(2, 15, 2)) + list(range(16, 27, 2)) + list(range(28, 41, 2))
        check([r.data["iteration"] for r in run.train] == want, "3 segments: train iterations 2..14, 16..26, 28..40 kept")
        check([r.data["iteration"] for r in run.evals] == [10, 20, 30, 40], "3 segments: eval iterations 10, 20 (segment 2), 30 (segment 3), 40 kept")
        check([r.data["iterations"] for r in run.summaries] == [40], "3 segments: only the last summary kept")
        check(run.dropped == 3 + 1 + 2 + 1 + 1, f"3 segments: 8 superseded records dropped ({run.dropped})")
        check([s.resumed_from for s in run.segments] == [0, 14, 26], "3 segments: resumed from 0, 14, 26")
        # Wall clock: segment 2 starts where iteration 14 of segment 1 was logged (5 s start-up +
        # 14 s + 0.5 s evaluation), not 3600 s later and not after segment 1's discarded work.
        first2 = next(r for r in run.train if r.segment.number == 2)
        check(abs(run.segments[1].wall_start_s - 19.5) < 1e-9 and abs(first2.elapsed_s - (19.5 + 5 + 2)) < 1e-9,
              f"3 segments: wall clock continues at 19.5 s ({run.segments[1].wall_start_s}), gaps removed")
        last = run.train[-1].elapsed_s
        check(abs(last - (19.5 + 5 + 12 + 0.5) - (5 + 14 + 0.5)) < 1e-9, f"3 segments: last train record at {last} s")
        lrs = hpct_metrics.learning_rates(run)
        check(lrs == [(i, _lr(i), True) for i in range(1, 41)],
              "3 segments: the learning rate of every iteration 1..40, each the value recorded for it "
              f"({[p[0] for p in lrs][:3]}...{[p[0] for p in lrs][-3:]})")
        xs, _ = plot_metrics._lr_line(lrs)
        check(xs == list(range(1, 41)), "3 segments: the learning-rate line is one piece (no iteration missing)")

    # A resume between log lines (log every 4, checkpoint at 14): segment 1's record at 16 held
    # iterations 13..16 and is dropped; segment 2's first record holds 15..16. Iterations 13 and 14
    # were trained, but no kept record has their rate: the line breaks there, nothing is made up.
    g1, t1 = _segment_records(1, 0, 18, T0, True, False, log_every=4)
    g2, _ = _segment_records(2, 14, 24, t1 + 600.0, True, True, log_every=4)
    path = os.path.join(d, "resume_between_log_lines.jsonl")
    write_jsonl(path, g1 + g2)
    run = check_file(path, os.path.join(d, "resume_between_log_lines.png"))
    if run:
        lrs = hpct_metrics.learning_rates(run)
        want = list(range(1, 13)) + list(range(15, 25))
        check(lrs == [(i, _lr(i), True) for i in want],
              f"resume between log lines: learning rates of iterations 1..12 and 15..24 ({[p[0] for p in lrs]})")
        xs, ys = plot_metrics._lr_line(lrs)
        gaps = [k for k, x in enumerate(xs) if math.isnan(x)]
        check(len(gaps) == 1 and xs[gaps[0] - 1] == 12 and xs[gaps[0] + 1] == 15 and math.isnan(ys[gaps[0]]),
              "resume between log lines: the learning-rate line breaks between 12 and 15, nothing drawn across")

    # Today's format: no segment records, no wall_time or memory; one file per segment.
    o1, _ = _segment_records(1, 0, 20, T0, False, False)
    o2, _ = _segment_records(2, 14, 30, T0, False, True)
    p1, p2 = os.path.join(d, "old_seg1.jsonl"), os.path.join(d, "old_seg2.jsonl")
    write_jsonl(p1, o1)
    write_jsonl(p2, o2)
    run = check_file(f"{p1},{p2}", os.path.join(d, "old_format.png"))
    if run:
        want = list(range(2, 15, 2)) + list(range(16, 31, 2))
        check([r.data["iteration"] for r in run.train] == want, "old format, 2 files: train iterations 2..14, 16..30")
        check(not run.has_wall_time, "old format: no wall-clock axis")
        check([s.resumed_from for s in run.segments] == [None, 14] and all(s.inferred for s in run.segments),
              "old format: inferred segments, the second resumed from its summary's start_iteration 14")
        lrs = hpct_metrics.learning_rates(run)
        check(lrs == [(i, _lr(i), False) for i in want] and plot_metrics._lr_line(lrs)[0] == want,
              "old format (no learning_rates): the logged learning rates, marked as log lines only, joined")

    # Bad input: one line naming file and line, exit status 1, no traceback.
    bad = os.path.join(d, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(_train(2, T0, 1)) + "\n" + '{"type": "train", "iteration": 4, "lm_loss": \n')
    for script, args in (("hpct_metrics.py", [bad, "--summary"]), ("plot_metrics.py", [bad, "-o", os.path.join(d, "bad.png")])):
        rc, out, err = run_tool(script, *args)
        check(rc == 1 and len(err.strip().splitlines()) == 1 and f"{bad}:2:" in err and "Traceback" not in err,
              f"{script} on a malformed line: exit 1, one line naming {os.path.basename(bad)}:2 ({err.strip()})")
    rc, out, err = run_tool("hpct_metrics.py", os.path.join(d, "missing.jsonl"))
    check(rc == 1 and "missing.jsonl" in err and "Traceback" not in err, f"a missing file: exit 1, named ({err.strip()})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", nargs="?", help="metrics file (segment files of one run joined by commas)")
    ap.add_argument("out_png", nargs="?", help="PNG to write")
    ap.add_argument("--synthetic", metavar="DIR", help="write synthetic runs into DIR (emptied first) and check them")
    a = ap.parse_args()
    if bool(a.synthetic) == bool(a.metrics and a.out_png):
        ap.error("give METRICS OUT.png, or --synthetic DIR")
    global PY
    for py in [sys.executable, "/usr/bin/python3"]:
        if os.path.exists(py) and subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0:
            PY = py
            break
    if not check(PY is not None, f"matplotlib imports in {sys.executable} or /usr/bin/python3 "
                 "(Debian: python3-matplotlib, scripts/install_deps.sh)"):
        print(f"{len(FAILS)} failed")
        return 1
    print(f"# tools run with {PY}")
    if a.synthetic:
        shutil.rmtree(a.synthetic, ignore_errors=True)
        synthetic(a.synthetic)
    else:
        check_file(a.metrics, a.out_png)
    print(f"{len(FAILS)} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
