#!/usr/bin/env python3
"""Reads pretrain_gpt / pretrain_moe metrics files (JSON lines) and stitches the segments of a
resumed run into one history: each iteration once, in order, with where every part came from.
Not a plotter (scripts/plot_metrics.py draws what this returns) and not a schema checker: keys it
does not use pass through untouched. Trade-off: the stitching rule is applied even to files that
the trainer already keeps clean, so several files, or files from before segment records, can be
joined by the same code.

    hpct_metrics.py RUN.jsonl [MORE.jsonl ...] [--summary] [--stitch OUT.jsonl]

Records (one JSON object a line, "type" says which): "segment" (first record of each segment:
resumed_from_iteration R, checkpoint, wall_time, hosts, git_commit, ...), "train" (one per log
interval; "learning_rates": the rate of each of its iterations, see learning_rates()), "eval",
"summary" (end of a segment; a killed segment has none). Other types pass through.

Stitching rule, applied in reading order over all files:
  - a segment record with resumed_from_iteration R drops every earlier train/eval record with
    iteration > R and every earlier summary with "iterations" > R;
  - a file whose first records come before any segment record (files written before segment
    records existed) starts an inferred segment: R is its summary's start_iteration when it has
    one, else the iteration just before its first train/eval record;
  - a train record whose iteration is not above the last kept one (a restart without a segment
    record) drops the earlier records with iteration >= its own, and an eval record drops the
    earlier eval records with iteration >= its own, so every iteration appears once.

Usable from Python without matplotlib: `run = load_run(["a.jsonl", "b.jsonl"])`.
"""
import argparse
import json
import math
import os
import sys

__all__ = ["MetricsError", "Record", "Segment", "Run", "load_run", "learning_rates", "split_run_arg", "stitched_lines",
           "summary_table", "main"]


class MetricsError(Exception):
    """Bad input: the message names the file and, where there is one, the line."""


class Record:
    """One kept record. data: the JSON object as read. elapsed_s: see Run.elapsed_s."""

    __slots__ = ("kind", "data", "segment", "path", "line", "elapsed_s")

    def __init__(self, kind, data, segment, path, line):
        self.kind, self.data, self.segment, self.path, self.line = kind, data, segment, path, line
        self.elapsed_s = None

    @property
    def iteration(self):
        """The iteration this record is about (a summary's "iterations"), or None."""
        return self.data.get("iterations" if self.kind == "summary" else "iteration")


class Segment:
    """One segment of the stitched run (number: 1-based in the stitched run).

    resumed_from: R (0 = fresh start; None = unknown, an inferred segment without a summary).
    inferred: no segment record was in the file; the segment was deduced from a file boundary.
    record: the segment record as read (None when inferred).
    wall_start_s: where this segment starts on the stitched wall-clock axis (None: no wall_time).
    first_iteration / last_iteration / n_train: over this segment's KEPT train records.
    """

    def __init__(self, number, resumed_from, inferred, record, path, line):
        self.number, self.resumed_from, self.inferred = number, resumed_from, inferred
        self.record, self.path, self.line = record, path, line
        self.wall_start_s = None
        self._origin = None  # unix time that maps to wall_start_s
        self.first_iteration = self.last_iteration = None
        self.n_train = 0

    @property
    def hosts(self):
        return (self.record or {}).get("hosts")

    @property
    def commit(self):
        return (self.record or {}).get("git_commit")


class Run:
    """A stitched run.

    paths: the files read, in order. segments: [Segment]. records: every kept record in reading
    order (segment records included). train / evals / summaries: the kept records of each kind.
    dropped: how many train/eval/summary records stitching dropped (superseded by a resume).

    Wall-clock axis (Record.elapsed_s, seconds): training time with the gaps between segments
    removed. Within segment k a record's value is base_k + (wall_time - start_k), where start_k is
    the segment record's wall_time (the segment's first timed record's when the segment record has
    none) and base_k is the value of the last record that was still kept when segment k began (0
    for the first). So the axis counts each segment's start-up (checkpoint load, first interval)
    and leaves out both the time between segments (queue wait, requeue) and the time a segment
    spent on iterations that a later resume threw away. None for records without wall_time.
    """

    def __init__(self, paths):
        self.paths = list(paths)
        self.segments = []
        self.records = []
        self.dropped = 0

    def _of(self, kind):
        return [r for r in self.records if r.kind == kind]

    @property
    def train(self):
        return self._of("train")

    @property
    def evals(self):
        return self._of("eval")

    @property
    def summaries(self):
        return self._of("summary")

    @property
    def has_wall_time(self):
        return any(r.elapsed_s is not None for r in self.records)

    def label(self):
        """Default label: the first file's stem, and how many files when there are several."""
        stem = os.path.splitext(os.path.basename(self.paths[0]))[0] if self.paths else "run"
        return stem if len(self.paths) < 2 else f"{stem} ({len(self.paths)} files)"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _read_file(path):
    """[(line_number, object)] for one file; MetricsError for anything malformed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise MetricsError(f"{path}: cannot read: {e.strerror or e}") from None
    out = []
    lines = raw.split(b"\n")
    for n, b in enumerate(lines, 1):
        if not b.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(b.decode("utf-8"))
        except UnicodeDecodeError:
            raise MetricsError(f"{where}: not UTF-8 text") from None
        except ValueError as e:
            last = n == len(lines)  # no newline after it: the writer stopped mid-line
            hint = " (the last line has no newline: was the writer killed mid-line?)" if last else ""
            raise MetricsError(f"{where}: not valid JSON: {e.msg} (column {e.colno}){hint}") from None
        if not isinstance(obj, dict):
            raise MetricsError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise MetricsError(f"{where}: no \"type\" string")
        if kind in ("train", "eval") and not (_is_int(obj.get("iteration")) and obj["iteration"] >= 0):
            raise MetricsError(f"{where}: {kind} record without an integer \"iteration\"")
        if kind == "summary" and "iterations" in obj and not _is_int(obj["iterations"]):
            raise MetricsError(f"{where}: summary \"iterations\" is not an integer")
        if kind == "segment":
            r = obj.get("resumed_from_iteration")
            if not (_is_int(r) and r >= 0):
                raise MetricsError(f"{where}: segment record without an integer \"resumed_from_iteration\" >= 0")
        wt = obj.get("wall_time")
        if wt is not None and not _is_num(wt):
            raise MetricsError(f"{where}: \"wall_time\" is not a number")
        out.append((n, obj))
    return out


def _inferred_resume(chunk):
    """(R for dropping, R to display) for records that come before any segment record."""
    for _, obj in chunk:
        if obj["type"] == "summary" and _is_int(obj.get("start_iteration")):
            return obj["start_iteration"], obj["start_iteration"]
    its = [obj["iteration"] for _, obj in chunk if obj["type"] in ("train", "eval")]
    return (min(its) - 1 if its else None), None


class _Stitcher:
    def __init__(self, run):
        self.run = run
        self.seg = None
        self.last_train = None  # iteration of the last kept train record

    def _truncate_after(self, r):
        keep = []
        for rec in self.run.records:
            it = rec.iteration if rec.kind != "segment" else None
            if _is_int(it) and it > r and rec.kind in ("train", "eval", "summary", "other"):
                if rec.kind != "other":
                    self.run.dropped += 1
                continue
            keep.append(rec)
        self.run.records = keep
        trains = [rec.data["iteration"] for rec in keep if rec.kind == "train"]
        self.last_train = trains[-1] if trains else None

    def start_segment(self, drop_after, shown, inferred, obj, path, line):
        if drop_after is not None:
            self._truncate_after(drop_after)
        base = 0.0
        for rec in reversed(self.run.records):
            if rec.elapsed_s is not None:
                base = rec.elapsed_s
                break
        seg = Segment(len(self.run.segments) + 1, shown, inferred, obj, path, line)
        seg.wall_start_s = base
        if obj is not None and _is_num(obj.get("wall_time")):
            seg._origin = obj["wall_time"]
        self.run.segments.append(seg)
        self.seg = seg
        if obj is not None:
            self.run.records.append(Record("segment", obj, seg, path, line))

    def add(self, obj, path, line):
        kind = obj["type"]
        if kind not in ("train", "eval", "summary"):
            kind = "other"
        if kind == "train" and self.last_train is not None and obj["iteration"] <= self.last_train:
            self._truncate_after(obj["iteration"] - 1)  # a restart nobody recorded
        elif kind == "eval":
            n = len(self.run.records)
            self.run.records = [r for r in self.run.records if not (r.kind == "eval" and r.data["iteration"] >= obj["iteration"])]
            self.run.dropped += n - len(self.run.records)
        rec = Record(kind, obj, self.seg, path, line)
        wt = obj.get("wall_time")
        if kind in ("train", "eval") and _is_num(wt):
            if self.seg._origin is None:
                self.seg._origin = wt
            rec.elapsed_s = self.seg.wall_start_s + (wt - self.seg._origin)
        if kind == "train":
            self.last_train = obj["iteration"]
        self.run.records.append(rec)


def load_run(paths):
    """Reads the metrics files `paths` (in this order, as one run) and stitches them.

    Returns a Run (see its docstring for the wall-clock axis). Raises MetricsError naming the file
    and line for unreadable files and malformed lines.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    run = Run([os.fspath(p) for p in paths])
    if not run.paths:
        raise MetricsError("no metrics file given")
    st = _Stitcher(run)
    for path in run.paths:
        rows = _read_file(path)
        first_seg = next((i for i, (_, o) in enumerate(rows) if o["type"] == "segment"), len(rows))
        head = rows[:first_seg]
        if head:  # records before any segment record: an older file, or a file's continuation
            drop_after, shown = _inferred_resume(head)
            st.start_segment(drop_after, shown, True, None, path, head[0][0])
        for n, obj in rows:
            if obj["type"] == "segment":
                r = obj["resumed_from_iteration"]
                st.start_segment(r, r, False, obj, path, n)
            else:
                st.add(obj, path, n)
    for seg in run.segments:
        its = [r.data["iteration"] for r in run.records if r.kind == "train" and r.segment is seg]
        seg.n_train = len(its)
        if its:
            seg.first_iteration, seg.last_iteration = its[0], its[-1]
    return run


def learning_rates(run):
    """The learning rate of every iteration the stitched run recorded: [(iteration, rate,
    per_iteration)], by increasing iteration.

    A train record's "learning_rates" holds the rate of each iteration since the record before it
    (written by the trainer, one per step; its last is "learning_rate"): those are spread over
    the iterations they belong to, per_iteration True. A record without the list (files written
    before the trainer recorded it) gives its logged "learning_rate" alone, per_iteration False.
    Iterations that no kept record covers (a segment killed after its checkpoint and before its
    next log line) are left out, not filled in. A later record wins an iteration two records
    claim, as in the stitching rule.
    """
    by_it = {}
    for r in run.train:
        it, rates = r.data["iteration"], r.data.get("learning_rates")
        if isinstance(rates, list) and 0 < len(rates) <= it and all(_is_num(v) for v in rates):
            first = it - len(rates) + 1
            for k, v in enumerate(rates):
                by_it[first + k] = (v, True)
        elif _is_num(r.data.get("learning_rate")):
            by_it[it] = (r.data["learning_rate"], False)
    return [(it, v, every) for it, (v, every) in sorted(by_it.items())]


def split_run_arg(arg):
    """'a.jsonl,b.jsonl' -> ['a.jsonl', 'b.jsonl'] (the segment files of one run)."""
    parts = [p for p in arg.split(",") if p]
    if not parts:
        raise MetricsError(f"empty run argument {arg!r}")
    return parts


def stitched_lines(run):
    """The stitched file's lines: kept records in order; segments renumbered 1..n, each with its
    source; an inferred segment gets a segment record marked "inferred": true."""
    out = []
    emitted = set()
    for rec in run.records:
        seg = rec.segment
        if seg is not None and seg.number not in emitted:
            emitted.add(seg.number)
            if seg.record is None:
                r = seg.resumed_from
                if r is None:
                    r = seg.first_iteration - 1 if seg.first_iteration else 0
                out.append(json.dumps({"type": "segment", "segment": seg.number, "resumed_from_iteration": r,
                                       "inferred": True, "source": f"{seg.path}:{seg.line}"}))
        if rec.kind == "segment":
            d = dict(rec.data)
            d["segment"] = seg.number
            d["source"] = f"{rec.path}:{rec.line}"
            out.append(json.dumps(d))
        else:
            out.append(json.dumps(rec.data))
    return out


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def _fmt_range(seg):
    if seg.first_iteration is None:
        return "-"
    return f"{seg.first_iteration}-{seg.last_iteration}"


def summary_table(run):
    rows = [("segment", "resumed_from", "iterations", "train_records", "hosts", "commit", "source")]
    for s in run.segments:
        r = "?" if s.resumed_from is None else str(s.resumed_from)
        if s.inferred:
            r += " (inferred)"
        hosts = s.hosts
        hosts = ",".join(map(str, hosts)) if isinstance(hosts, list) and hosts else "-"
        rows.append((str(s.number), r, _fmt_range(s), str(s.n_train), hosts, str(s.commit or "-"),
                     f"{s.path}:{s.line}"))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    tr = run.train
    span = f"iterations {tr[0].data['iteration']}-{tr[-1].data['iteration']}" if tr else "no train records"
    lines.append(f"# stitched: {plural(len(run.segments), 'segment')}, {len(tr)} train records ({span}), "
                 f"{len(run.evals)} eval records, {len(run.summaries)} summary records; "
                 f"dropped {run.dropped} records superseded by a resume")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="hpct_metrics.py",
        description="Stitch the segments of a resumed run's metrics files (JSON lines) and show them.")
    ap.add_argument("files", nargs="+", metavar="RUN.jsonl",
                    help="metrics files of one run, in order (a,b joined with a comma also works)")
    ap.add_argument("--stitch", metavar="OUT.jsonl", help="write the stitched, deduplicated file here")
    ap.add_argument("--summary", action="store_true",
                    help="print one line per segment (the default when --stitch is not given)")
    a = ap.parse_args(argv)
    try:
        paths = [p for f in a.files for p in split_run_arg(f)]
        run = load_run(paths)
        if a.stitch:
            tmp = a.stitch + ".tmp"
            try:
                with open(tmp, "w") as f:
                    for line in stitched_lines(run):
                        f.write(line + "\n")
                os.replace(tmp, a.stitch)
            except OSError as e:
                raise MetricsError(f"{a.stitch}: cannot write: {e.strerror or e}") from None
            print(f"wrote {a.stitch}: {plural(len(run.segments), 'segment')}, {len(run.train)} train records, "
                  f"{len(run.evals)} eval records (dropped {run.dropped})")
        if a.summary or not a.stitch:
            print("\n".join(summary_table(run)))
    except MetricsError as e:
        print(f"hpct_metrics.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
