#!/usr/bin/env python3
"""Runs a command and checks what a user would see.

run_check.py [--rc N | --rc-nonzero] [--regex R]... [--not-regex R]... [--metrics FILE --check NAME] -- CMD...
--check names one of the assertions on a pretrain_gpt metrics file defined below."""
import argparse
import json
import math
import re
import subprocess
import sys


def check_loss_falls(recs):
    train = [r for r in recs if r.get("type") == "train"]
    evals = [r for r in recs if r.get("type") == "eval"]
    summ = [r for r in recs if r.get("type") == "summary"]
    assert len(train) >= 2, f"expected several train records, got {len(train)}"
    first, last = train[0]["lm_loss"], train[-1]["lm_loss"]
    assert last < first - 2.0, f"lm loss did not fall by 2 nats: {first} -> {last}"
    assert evals, "no evaluation record"
    assert math.isfinite(evals[-1]["val_loss"]) and evals[-1]["val_loss"] < first, evals[-1]
    assert summ and summ[-1]["unigram_val_ppl"] > 1, "summary lacks the unigram baseline"
    print(f"lm loss {first:.3f} -> {last:.3f}; val ppl {evals[-1]['val_ppl']:.1f}, unigram {summ[-1]['unigram_val_ppl']:.1f}")


def check_schema(recs):
    train = [r for r in recs if r.get("type") == "train"]
    assert train, "no train records"
    need = ["iteration", "consumed_samples", "lm_loss", "learning_rate", "grad_norm", "loss_scale",
            "elapsed_ms_per_iteration", "tokens_per_second", "tflops_per_rank", "global_batch_size"]
    for r in train:
        for k in need:
            assert k in r, f"train record lacks '{k}': {r}"
    assert [r["iteration"] for r in train] == sorted(r["iteration"] for r in train)
    summ = [r for r in recs if r.get("type") == "summary"]
    assert summ, "no summary record"
    s = summ[-1]
    for k in ["peak_rss_bytes_per_rank", "total_seconds", "tokens_per_second"]:
        assert k in s, f"summary lacks '{k}'"
    assert len(s["peak_rss_bytes_per_rank"]) == s["world_size"] and min(s["peak_rss_bytes_per_rank"]) > 0
    assert all(math.isfinite(r["lm_loss"]) for r in train)
    print(f"{len(train)} train records; peak rss per rank {s['peak_rss_bytes_per_rank']}")


def check_tp_bytes(recs):
    """Tensor parallelism: the f/g all-reduce bytes per step are Megatron's 4 x B*s*h per layer plus
    the embedding's and the LM head's: (4L + 2) / 4L times the formula, on every rank, exactly. With
    sequence parallelism each becomes an all-gather and a reduce-scatter of the same buffer (twice
    the payload); either way a ring moves 2(T-1)/T of the all-reduces' payload per rank."""
    seg = [r for r in recs if r.get("type") == "segment"][-1]
    L = seg["config"]["model"]["num_layers"]
    tp = [r for r in recs if r.get("type") == "summary"][-1]["tensor_parallel"]
    T = tp["size"]
    allreduced = (4 * L + 2) / (4 * L) * tp["megatron_layer_formula_bytes_per_step"]
    want = allreduced * (2 if tp["sequence_parallel"] else 1)
    got = tp["allreduce_bytes_per_step_per_rank"]
    assert all(g == want for g in got), f"f/g bytes per step {got}, expected {want}"
    wire = tp["wire_bytes_per_step_per_rank"]
    want_wire = allreduced * 2 * (T - 1) / T
    assert all(abs(w - want_wire) <= 1e-9 * want_wire for w in wire), f"ring bytes per step {wire}, expected {want_wire}"
    kind = "all-gather + reduce-scatter" if tp["sequence_parallel"] else "all-reduce"
    print(f"tensor-parallel {kind} bytes per step {got[0]:.0f} = {want / tp['megatron_layer_formula_bytes_per_step']:.4f}"
          f" x Megatron's formula; ring bytes {wire[0]:.0f} = 2(T-1)/T x the all-reduces'")


def check_slw(recs):
    """Sequence-length warmup: every logged step's curriculum_seqlen and the consumed tokens are
    DeepSpeed's fixed_linear/fixed_root pacing (recomputed here from the segment's config), the
    length reaches the maximum, and the tokens count the truncated lengths."""
    seg = [r for r in recs if r.get("type") == "segment"][-1]
    cl, gb = seg["config"]["curriculum"], seg["config"]["global_batch_size"]
    assert cl and cl["schedule_type"] in ("fixed_linear", "fixed_root"), f"curriculum {cl}"
    root = cl["root_degree"] if cl["schedule_type"] == "fixed_root" else 1.0

    def seqlen(it):  # iteration it (0-based) trains at difficulty(it + 1)
        d = math.floor(((it + 1) / cl["total_curriculum_step"]) ** (1.0 / root) *
                       (cl["max_difficulty"] - cl["min_difficulty"]) + cl["min_difficulty"])
        return min(d - d % cl["difficulty_step"], cl["max_difficulty"])

    train = [r for r in recs if r.get("type") == "train"]
    assert train, "no train records"
    for r in train:
        it = r["iteration"]
        assert r["curriculum_seqlen"] == seqlen(it - 1), f"iteration {it}: seqlen {r['curriculum_seqlen']}, want {seqlen(it - 1)}"
        want = sum(gb * seqlen(i) for i in range(it))
        assert r["consumed_tokens"] == want, f"iteration {it}: consumed tokens {r['consumed_tokens']}, want {want}"
    assert train[-1]["curriculum_seqlen"] == cl["max_difficulty"], "never reached the full length"
    print(f"curriculum seqlen {train[0]['curriculum_seqlen']} -> {train[-1]['curriculum_seqlen']}, "
          f"consumed tokens {train[-1]['consumed_tokens']} as DeepSpeed's pacing gives")


def check_ltd(recs):
    """random-LTD: every logged step's reserved length is DeepSpeed's RandomLTDScheduler value
    (fixed_linear, recomputed here from the segment's config), the consumed layer-tokens its
    consumed_layer_tokens formula, the actual seqlen Megatron-DeepSpeed's effective length, and the
    reserved length reaches the maximum."""
    seg = [r for r in recs if r.get("type") == "segment"][-1]
    cfg = seg["config"]
    ltd, gb = cfg["random_ltd"], cfg["global_batch_size"]
    S, L = cfg["model"]["seq_length"], cfg["model"]["num_layers"]
    Lr = len(ltd["layers"])
    assert ltd, "no random_ltd in the config"

    def kept(it):  # iteration it (0-based) keeps get_value(global_steps = it)
        r = math.floor(it / ltd["require_steps"] * (ltd["max_value"] - ltd["min_value"]) + ltd["min_value"])
        return min(r - r % ltd["seq_per_step"], ltd["max_value"], S)

    train = [r for r in recs if r.get("type") == "train"]
    assert train, "no train records"
    for r in train:
        it = r["iteration"]
        assert r["random_ltd_reserved_length"] == kept(it - 1), \
            f"iteration {it}: reserved length {r['random_ltd_reserved_length']}, want {kept(it - 1)}"
        want = sum(gb * (kept(i) * Lr + S * (L - Lr)) for i in range(it))
        assert r["consumed_layer_tokens"] == want, f"iteration {it}: layer-tokens {r['consumed_layer_tokens']}, want {want}"
        assert r["actual_seqlen"] == (kept(it - 1) * Lr + S * (L - Lr)) // L, f"iteration {it}: actual seqlen {r['actual_seqlen']}"
        assert r["consumed_tokens"] == gb * S * it, "data tokens are consumed whole"
    assert train[-1]["random_ltd_reserved_length"] == ltd["max_value"], "never reached max_value"
    print(f"random ltd reserved length {train[0]['random_ltd_reserved_length']} -> "
          f"{train[-1]['random_ltd_reserved_length']}, consumed layer-tokens {train[-1]['consumed_layer_tokens']} "
          f"as DeepSpeed's scheduler gives")


def check_learning_rates(recs):
    """Every train record's learning_rates holds one learning rate per iteration since the record
    before it (its last one is learning_rate), and together they are Megatron's iteration-based
    schedule (recomputed here from the segment's config) step by step, where a skipped fp16 step
    repeats the rate of the step taken after it (the scheduler only moves on a taken step): so
    the rates cannot be rebuilt from the config alone, and the skips show. Needs a schedule that
    moves at every step (warmup or decay, not a constant stretch) to tell a skip from a step."""
    seg = [r for r in recs if r.get("type") == "segment"][-1]
    cfg = seg["config"]
    styles = {0: "constant", 1: "linear", 2: "cosine"}  # LrStyle's order (train_config.hpp)
    assert cfg["lr_style"] in styles, f"lr_style {cfg['lr_style']}: only Megatron's constant/linear/cosine are recomputed"
    assert not (cfg["lr_warmup_tokens"] or cfg["lr_decay_tokens"] or cfg["train_samples"] or cfg["rampup_batch_size"]), \
        "token- and sample-based schedules are not recomputed here"
    lr, min_lr, W, D = cfg["lr"], cfg["min_lr"], cfg["lr_warmup_iters"], cfg["lr_decay_iters"]

    def sched(s):  # schedules.cpp, iteration-based: step s (0-based) counts s + 1
        it = s + 1
        if W > 0 and it <= W:
            return lr * it / W
        if styles[cfg["lr_style"]] == "constant":
            return lr
        if it > D:
            return min_lr
        ratio = min(max((it - W) / max(1.0, D - W), 0.0), 1.0)
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0) if styles[cfg["lr_style"]] == "cosine" else 1.0 - ratio
        return min_lr + coeff * (lr - min_lr)

    train = [r for r in recs if r.get("type") == "train"]
    assert train, "no train records"
    assert seg["resumed_from_iteration"] == 0, "a fresh run: the schedule is walked from step 0"
    rates, prev = [], 0
    for r in train:
        got = r.get("learning_rates")
        assert isinstance(got, list), f"iteration {r['iteration']}: no learning_rates list"
        assert len(got) == r["iteration"] - prev, \
            f"iteration {r['iteration']}: {len(got)} learning rates for iterations {prev + 1}..{r['iteration']}"
        assert got[-1] == r["learning_rate"], f"iteration {r['iteration']}: last rate {got[-1]} != learning_rate {r['learning_rate']}"
        rates += got
        prev = r["iteration"]

    def close(a, b):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0)

    assert close(rates[0], sched(0)), f"iteration 1: learning rate {rates[0]}, schedule {sched(0)}"
    step, repeats = 0, 0
    for i, v in enumerate(rates[1:], 2):
        if close(v, sched(step + 1)):
            step += 1
        elif close(v, sched(step)):
            repeats += 1  # the iteration before was skipped: the scheduler did not move
        else:
            raise AssertionError(f"iteration {i}: learning rate {v}, schedule step {step + 1} {sched(step + 1)} "
                                 f"(or {sched(step)} after a skipped step)")
    skipped = train[-1]["skipped_iterations"]
    # A skip is seen by the rate after it, so a skipped last iteration goes unseen.
    assert repeats in (skipped, skipped - 1), f"{repeats} repeated rates for {skipped} skipped iterations"
    print(f"learning rate at every iteration: {len(rates)} rates in {len(train)} records, {step + 1} schedule steps, "
          f"{repeats} repeated by skipped steps; {rates[0]:.6g} -> {rates[-1]:.6g}")


CHECKS = {"loss_falls": check_loss_falls, "schema": check_schema, "tp_bytes": check_tp_bytes, "slw": check_slw,
          "ltd": check_ltd, "learning_rates": check_learning_rates}

ap = argparse.ArgumentParser()
ap.add_argument("--rc", type=int)
ap.add_argument("--rc-nonzero", action="store_true")
ap.add_argument("--regex", action="append", default=[])
ap.add_argument("--not-regex", action="append", default=[])
ap.add_argument("--metrics")
ap.add_argument("--check", action="append", default=[])
ap.add_argument("cmd", nargs=argparse.REMAINDER)
a = ap.parse_args()
cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
out = p.stdout
sys.stdout.write(out[-6000:])
ok = True
if a.rc is not None and p.returncode != a.rc:
    print(f"FAIL: exit code {p.returncode}, expected {a.rc}")
    ok = False
if a.rc_nonzero and p.returncode == 0:
    print("FAIL: exit code 0, expected an error")
    ok = False
for r in a.regex:
    if not re.search(r, out):
        print(f"FAIL: output lacks /{r}/")
        ok = False
for r in a.not_regex:
    if re.search(r, out):
        print(f"FAIL: output has /{r}/")
        ok = False
if a.metrics:
    recs = [json.loads(l) for l in open(a.metrics) if l.strip()]
    for c in a.check:
        try:
            CHECKS[c](recs)
        except AssertionError as e:
            print(f"FAIL: {c}: {e}")
            ok = False
sys.exit(0 if ok else 1)
