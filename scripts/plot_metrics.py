#!/usr/bin/env python3
"""Draws one PNG from pretrain_gpt / pretrain_moe metrics files: loss against iterations, tokens
and wall-clock; throughput; memory; the learning rate of every iteration (each train record's
"learning_rates"; files without them give the rate at log lines only, and say so in the legend);
gradient norm (and the params norm where --log-params-norm recorded it); loss scale. Several runs
overlay. Not a dashboard (no smoothing, no live refresh); reading and stitching live in
hpct_metrics.py, so what is drawn is exactly the stitched run that `hpct_metrics.py --stitch`
writes.

    plot_metrics.py RUN.jsonl [RUN2.jsonl ...] -o out.png [--label NAME ...] [--title T] [--segments]

A run given as `a.jsonl,b.jsonl` is the segments of one run, stitched in that order. Files from
before wall_time / memory were recorded still plot: those panels say what is missing.
Needs matplotlib (Debian: python3-matplotlib); draws with the Agg backend, no display needed.
"""
import argparse
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hpct_metrics  # noqa: E402  (next to this file)

GIB = float(1 << 30)


def _xy(records, xkey, ykey, xfun=None, yfun=None):
    """Points (x, y) of records that have both values as numbers."""
    xs, ys = [], []
    for r in records:
        x = xfun(r) if xfun else r.data.get(xkey)
        y = yfun(r) if yfun else r.data.get(ykey)
        if hpct_metrics._is_num(x) and hpct_metrics._is_num(y):
            xs.append(x)
            ys.append(y)
    return xs, ys


def _scaled(v, div):
    return v / div if hpct_metrics._is_num(v) else None


def _mem(key):
    def f(r):
        m = r.data.get("memory")
        v = m.get(key) if isinstance(m, dict) else None
        return v / GIB if hpct_metrics._is_num(v) else None
    return f


def _token_scale(runs):
    top = max((r.data.get("consumed_tokens") or 0 for run in runs for r in run.train
               if hpct_metrics._is_num(r.data.get("consumed_tokens"))), default=0)
    for div, name in ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands")):
        if top >= 2 * div:
            return div, name
    return 1.0, ""


def _time_scale(runs):
    top = max((r.elapsed_s for run in runs for r in run.records if r.elapsed_s is not None), default=0)
    if top >= 2 * 3600:
        return 3600.0, "h"
    if top >= 2 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _note(ax, text):
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.3", fontsize=10,
            bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})


def _segment_lines(ax, run, color, xfun):
    for s in run.segments:
        if s.number == 1 and not s.resumed_from:
            continue  # a fresh start: nothing to mark
        x = xfun(s)
        if x is not None:
            ax.axvline(x, color=color, linestyle=":", linewidth=1.2, alpha=0.8)


def _lr_line(points):
    """x, y of hpct_metrics.learning_rates(run) for one line, broken (a NaN) where two
    per-iteration points are more than one iteration apart: nothing recorded those iterations, so
    nothing is drawn there. Logged-only points (older files) are joined as before."""
    xs, ys = [], []
    prev = None
    for it, lr, every in points:
        if prev is not None and every and prev[1] and it > prev[0] + 1:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(it)
        ys.append(lr)
        prev = (it, every)
    return xs, ys


def _tokens_at(run, iteration):
    """consumed_tokens of the last kept train record at or before `iteration` (None if none)."""
    best = None
    for r in run.train:
        if r.data["iteration"] <= iteration and hpct_metrics._is_num(r.data.get("consumed_tokens")):
            best = r.data["consumed_tokens"]
    return best


def plot(runs, labels, out, title=None, segments=False):
    """Draws `runs` (hpct_metrics.Run) into the PNG `out`. Returns, for each run, the number of
    train points drawn on the loss-against-iterations panel and the learning-rate points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axs = plt.subplots(3, 3, figsize=(18, 15), dpi=100)
    ax_it, ax_tok, ax_wall = axs[0]
    ax_tps, ax_mem, ax_lr = axs[1]
    ax_gn, ax_ls, ax_spare = axs[2]
    ax_spare.axis("off")
    ax_pn = None  # the params norm's own axis, made when a run has one
    for ax in (ax_tps, ax_mem, ax_lr, ax_gn, ax_ls):
        ax.sharex(ax_it)  # the iteration panels share one range, even an empty one
    ax_tfl = ax_tps.twinx()
    tok_div, tok_name = _token_scale(runs)
    t_div, t_unit = _time_scale(runs)
    counts = []
    missing_wall, missing_mem, missing_val = [], [], []
    any_tflops = False
    any_every_lr = False  # a run recorded the learning rate of every iteration
    for i, (run, label) in enumerate(zip(runs, labels)):
        c = colors[i % len(colors)]
        tr, ev = run.train, run.evals
        xs, ys = _xy(tr, "iteration", "lm_loss")
        ax_it.plot(xs, ys, color=c, linewidth=1.4, label=f"{label} train")
        n_loss = len(xs)
        vx, vy = _xy(ev, "iteration", "val_loss")
        if vx:
            ax_it.plot(vx, vy, color=c, linestyle="--", marker="o", markersize=4, linewidth=1, label=f"{label} validation")
        else:
            missing_val.append(label)

        xs, ys = _xy(tr, None, "lm_loss", xfun=lambda r: _scaled(r.data.get("consumed_tokens"), tok_div))
        ax_tok.plot(xs, ys, color=c, linewidth=1.4, label=label)

        if run.has_wall_time:
            xs, ys = _xy(tr, None, "lm_loss", xfun=lambda r: _scaled(r.elapsed_s, t_div))
            ax_wall.plot(xs, ys, color=c, linewidth=1.4, label=label)
            vx, vy = _xy(ev, None, "val_loss", xfun=lambda r: _scaled(r.elapsed_s, t_div))
            if vx:
                ax_wall.plot(vx, vy, color=c, linestyle="--", marker="o", markersize=4, linewidth=1)
        else:
            missing_wall.append(label)

        xs, ys = _xy(tr, "iteration", "tokens_per_second")
        ax_tps.plot(xs, ys, color=c, linewidth=1.4, label=label)
        xs, ys = _xy(tr, "iteration", "tflops_per_rank")
        if xs:
            any_tflops = True
            ax_tfl.plot(xs, ys, color=c, linestyle="--", linewidth=1.2)

        xs, ys = _xy(tr, "iteration", None, yfun=_mem("peak_rss_bytes"))
        dx, dy = _xy(tr, "iteration", None, yfun=_mem("device_bytes"))
        if xs:
            ax_mem.plot(xs, ys, color=c, linewidth=1.4, label=f"{label} peak RSS")
        if dx:
            ax_mem.plot(dx, dy, color=c, linestyle="--", linewidth=1.2, label=f"{label} device")
        if not xs and not dx:
            missing_mem.append(label)

        lrs = hpct_metrics.learning_rates(run)
        xs, ys = _lr_line(lrs)
        every = sum(1 for p in lrs if p[2])
        any_every_lr = any_every_lr or every > 0
        if every == len(lrs):
            lr_label = label
        elif every == 0:
            lr_label = f"{label} (at log lines only: no learning_rates in the file)"
        else:
            lr_label = f"{label} (older records: at log lines only)"
        ax_lr.plot(xs, ys, color=c, linewidth=1.4, label=lr_label)
        counts.append((n_loss, len(lrs)))

        xs, ys = _xy(tr, "iteration", "grad_norm")  # null (an fp16 overflow) is left out
        ax_gn.plot(xs, ys, color=c, linewidth=1.4, label=f"{label} grad norm")
        xs, ys = _xy(tr, "iteration", "params_norm")
        if xs:
            ax_pn = ax_pn or ax_gn.twinx()
            ax_pn.plot(xs, ys, color=c, linestyle="--", linewidth=1.2)
        xs, ys = _xy(tr, "iteration", "loss_scale")
        ax_ls.plot(xs, ys, color=c, linewidth=1.4, label=label)

        if segments:
            resumed = lambda s: s.resumed_from  # noqa: E731
            for ax in (ax_it, ax_tps, ax_lr, ax_gn, ax_ls) + (() if label in missing_mem else (ax_mem,)):
                _segment_lines(ax, run, c, resumed)
            _segment_lines(ax_tok, run, c, lambda s: None if s.resumed_from is None
                           else _scaled(_tokens_at(run, s.resumed_from), tok_div))
            if run.has_wall_time:
                _segment_lines(ax_wall, run, c, lambda s: s.wall_start_s / t_div)

    tok_label = f"tokens consumed ({tok_name})" if tok_name else "tokens consumed"
    ax_it.set(title="loss", xlabel="iteration", ylabel="lm loss (nats/token)")
    ax_tok.set(title="train loss against tokens", xlabel=tok_label, ylabel="lm loss (nats/token)")
    ax_wall.set(title="loss against training wall-clock", ylabel="lm loss (nats/token)",
                xlabel=f"wall-clock ({t_unit}), gaps between segments and discarded work removed")
    ax_tps.set(title="throughput", xlabel="iteration", ylabel="tokens/s (whole job, solid)")
    ax_tfl.set_ylabel("TFLOP/s per rank (dashed)")
    ax_mem.set(title="memory", xlabel="iteration", ylabel="GiB per rank (max over ranks)")
    ax_lr.set(title="learning rate (every iteration)" if any_every_lr else "learning rate (at log lines)",
              xlabel="iteration", ylabel="learning rate")
    ax_gn.set(title="gradient norm (before clipping)", xlabel="iteration", ylabel="grad norm (solid)")
    if ax_pn is not None:
        ax_pn.set_ylabel("params norm (dashed, --log-params-norm)")
    ax_ls.set(title="loss scale (fp16; 1 otherwise)", xlabel="iteration", ylabel="loss scale")
    ax_ls.set_yscale("log")
    # From zero, with headroom so the two curves and the legend do not sit on the frame.
    ax_tps.set_ylim(0, ax_tps.get_ylim()[1] * 1.3)
    if any_tflops:
        ax_tfl.set_ylim(0, ax_tfl.get_ylim()[1] * 1.15)
    # What a run lacks: a note across an empty panel, else a line in the panel's legend.
    for ax, missing, what in ((ax_wall, missing_wall, "wall_time"), (ax_mem, missing_mem, "memory records")):
        if missing and len(missing) == len(runs):
            if ax is ax_wall:
                ax.set_xticks([])  # the memory panel keeps the shared iteration axis
            ax.set_yticks([])
            _note(ax, f"no {what} in the metrics of:\n" + ", ".join(missing) +
                  "\n(written before the trainer recorded them)")
        elif missing:
            ax.plot([], [], " ", label=f"no {what}: " + ", ".join(missing))
    for ax in (ax_it, ax_tok, ax_wall, ax_mem, ax_lr, ax_tps, ax_gn, ax_ls):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    for ax in axs.flat:
        ax.grid(True, alpha=0.3)
    if title is None:
        title = "hpctrain metrics: " + ", ".join(labels)
    notes = []
    if segments:
        notes.append("dotted lines: segment starts (resumed iterations)")
    if missing_val:
        notes.append("no validation records: " + ", ".join(missing_val))
    fig.suptitle(title + ("\n" + "; ".join(notes) if notes else ""), fontsize=13)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(prog="plot_metrics.py", description="Plot pretrain_gpt / pretrain_moe metrics files into one PNG.")
    ap.add_argument("runs", nargs="+", metavar="RUN.jsonl",
                    help="one run per argument; the segment files of one run joined with a comma (a.jsonl,b.jsonl)")
    ap.add_argument("-o", "--output", required=True, metavar="out.png", help="PNG to write")
    ap.add_argument("--label", action="append", metavar="NAME", help="legend name of each run, in order (default: file stem)")
    ap.add_argument("--title", help="figure title")
    ap.add_argument("--segments", action="store_true", help="dotted vertical lines where segments resumed")
    a = ap.parse_args(argv)
    if a.label and len(a.label) != len(a.runs):
        print(f"plot_metrics.py: error: {len(a.label)} --label for {len(a.runs)} runs", file=sys.stderr)
        return 1
    try:
        runs = [hpct_metrics.load_run(hpct_metrics.split_run_arg(r)) for r in a.runs]
    except hpct_metrics.MetricsError as e:
        print(f"plot_metrics.py: error: {e}", file=sys.stderr)
        return 1
    labels = a.label or [r.label() for r in runs]
    if importlib.util.find_spec("matplotlib") is None:
        print(f"plot_metrics.py: error: matplotlib is not installed for {sys.executable} "
              "(Debian: apt-get install python3-matplotlib, then run with /usr/bin/python3)", file=sys.stderr)
        return 1
    try:
        counts = plot(runs, labels, a.output, a.title, a.segments)
    except OSError as e:
        print(f"plot_metrics.py: error: {a.output}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    print(a.output)
    for run, label, (n, n_lr) in zip(runs, labels, counts):
        print(f"{label}: {n} train points, {len(run.evals)} eval points, {hpct_metrics.plural(len(run.segments), 'segment')} "
              f"({len(run.train)} train records), {n_lr} learning-rate points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
