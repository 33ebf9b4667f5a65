#!/usr/bin/env python3
"""Megatron-DeepSpeed's recipes start unchanged on pretrain_gpt (tests/apps/recipes/: their flags and
ds_configs, sizes scaled down, paths given here):

- each trains to its own stop: --train-tokens for the rebase, MoE-dense and data-efficiency
  recipes (their --train-samples is only an upper bound, as in Megatron-DS), --train-iters for
  run_deepspeed_example; losses finite, the checkpoint and TensorBoard events written;
- every flag that changes nothing here says so in exactly one "> note:" line, and no other
  flag does;
- the rebase recipe runs on 2 ranks (ZeRO-1), and with _125M_flashattn.sh's --use-flash-attn;
- the MoE dense recipe with the 6.7B script's --rampup-batch-size ramps its global batch;
- run_deepspeed_example.sh's --global-batch-size disagrees with its ds_config's
  train_batch_size (1024 vs 64 there): refused in one line naming both; agreed, it trains;
- three unknown flags added to a recipe are named together in one error line.

recipes_check.py --gpt PRETRAIN_GPT --mpiexec MPIEXEC --recipes DIR --data DIR --workdir DIR
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--mpiexec", "--recipes", "--data", "--workdir")
a, check = c.args, c.check
data = ["--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", os.path.join(a.data, "gpt2-vocab.json"),
        "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]
# The flags accepted without effect (train_config_compat.cpp): each must say so once.
NO_OP = {"--num-workers", "--no-async-tensor-model-parallel-allreduce", "--data-impl",
         "--pipeline-model-parallel-size", "--no-pipeline-parallel", "--use-flash-attn", "--recompute-method",
         "--recompute-num-layers"}


def flags_of(args_file):
    out = []
    for line in open(args_file):
        line = line.split("#", 1)[0].split()
        out += [t.split("=", 1)[0] for t in line if t.startswith("--")]
    return out


def recipe(name, ds, *extra, ranks=1, want=0, label=None):
    """Runs recipe `name` with ds_config `ds` in its own work directory (`label`, default the name)."""
    out = os.path.join(a.workdir, label or name)
    os.makedirs(out, exist_ok=True)
    cmd = [a.gpt, "@" + os.path.join(a.recipes, name + ".args"), *data, "--save", os.path.join(out, "ckpt"),
           "--load", os.path.join(out, "ckpt"), "--tensorboard-dir", os.path.join(out, "tb"),
           "--deepspeed_config", os.path.join(a.recipes, ds + ".json"), "--metrics-file", os.path.join(out, "m.jsonl"),
           "--json", os.path.join(out, "summary.json"), *extra]
    if ranks > 1:
        cmd = [a.mpiexec, "-n", str(ranks), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), *cmd]
    p = c.run(cmd, want=want)
    summ = json.load(open(os.path.join(out, "summary.json"))) if os.path.exists(os.path.join(out, "summary.json")) else {}
    return p, summ, out


def trains(label, name, ds, *extra, stop="train_tokens", ranks=1):
    p, s, out = recipe(name, ds, *extra, ranks=ranks, label=label)
    recs = [json.loads(x) for x in open(os.path.join(out, "m.jsonl"))] if os.path.exists(os.path.join(out, "m.jsonl")) else []
    train = [r for r in recs if r.get("type") == "train"]
    check(p.returncode == 0 and s.get("exit_reason") == stop and len(train) >= 3 and
          all(0 < r["lm_loss"] < 12 for r in train),
          f"{label}: trains to its own stop ({s.get('exit_reason')}, wanted {stop}) after {len(train)} iterations, "
          f"losses {[round(r['lm_loss'], 3) for r in train]}")
    check(os.path.exists(os.path.join(out, "ckpt", "latest")) and
          any(f.startswith("events.out.tfevents") for _, _, fs in os.walk(os.path.join(out, "tb")) for f in fs),
          f"{label}: checkpoint and TensorBoard events written")
    notes = [ln for ln in p.stdout.splitlines() if ln.startswith("> note: ")]
    given = set(flags_of(os.path.join(a.recipes, name + ".args"))) | {e for e in extra if e.startswith("--")}
    want = sorted(given & NO_OP)
    said = sorted(ln.split()[2] for ln in notes)
    check(said == want, f"{label}: one note per flag without effect: {said} (wanted {want})")
    return p


trains("rebase_gpt", "rebase_gpt", "rebase_ds_config", ranks=2)
trains("rebase_flashattn", "rebase_gpt", "rebase_ds_config", "--use-flash-attn")
trains("rebase_new_125M", "rebase_new_125M", "rebase_ds_config")
trains("moe_dense", "moe_dense", "moe_ds_config")
# ds_pretrain_gpt_6.7B_dense.sh adds --rampup-batch-size (32 32 1953125 there): here 2 2 16 samples
# to the recipe's global batch of 8; the metrics show the batch growing to it.
trains("moe_dense_rampup", "moe_dense", "moe_ds_config", "--rampup-batch-size", "2", "2", "16")
gb = [json.loads(x).get("global_batch_size") for x in open(os.path.join(a.workdir, "moe_dense_rampup", "m.jsonl"))
      if json.loads(x).get("type") == "train"]
check(gb[:1] == [2] and gb[-1] == 8 and all(x <= y for x, y in zip(gb, gb[1:])),
      f"--rampup-batch-size 2 2 16: the global batch grows from 2 to 8 ({gb})")
trains("data_efficiency", "data_efficiency", "data_efficiency_ds_config")

# --exit-duration-in-mins (Megatron's wall-clock limit; here 6 ms): saves and stops after the first step.
p, s, out = recipe("rebase_gpt", "rebase_ds_config", "--exit-duration-in-mins", "0.0001", label="exit_duration")
check(s.get("exit_reason") == "exit_duration" and s.get("iterations") == 1 and "--exit-duration-in-mins reached" in p.stdout and
      os.path.exists(os.path.join(out, "ckpt", "iter_0000001.h5")),
      f"--exit-duration-in-mins: saved and stopped after iteration {s.get('iterations')} ({s.get('exit_reason')})")

p, _, _ = recipe("run_deepspeed_example", "run_deepspeed_example_ds_config", want=None)
c.one_line_error("run_deepspeed_example as written (its batch flag and ds_config disagree)", p, "pretrain_gpt",
                 ["'train_batch_size' = 8 disagrees with --global-batch-size 32", "run_deepspeed_example_ds_config.json"])
trains("run_deepspeed_example_agreed", "run_deepspeed_example", "run_deepspeed_example_ds_config", "--global-batch-size", "8",
       stop="completed")

p = c.run([a.gpt, "@" + os.path.join(a.recipes, "rebase_gpt.args"), *data, "--frobnicate", "2", "--no-such-switch",
           "--colour", "red"], want=None)
c.one_line_error("three unknown flags", p, "pretrain_gpt",
                 ["3 flags are not accepted", "'--frobnicate'", "'--no-such-switch'", "'--colour'"])
c.finish()
