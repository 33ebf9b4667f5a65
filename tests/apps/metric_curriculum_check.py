#!/usr/bin/env python3
"""Curriculum by a data metric as a user runs it (docs/data-efficiency.md): analyze_data on Brown over
2 ranks writes the vocab_rarity index files; pretrain_gpt on 2 ranks trains 24 steps with
Megatron-DeepSpeed's data_sampling block (percentile 10 -> 100, fixed_root 2 over 20 steps) naming
them. Checked: the analyzer's printed paths exist and its samples match the run's; every logged
difficulty is DeepSpeed's pacing recomputed here, the allowed samples are N // 100 per point (all N
at 100); the loss falls; evaluation records exist. Two metrics (vocab_rarity and seqlen, both
analyzed in one analyze_data run): each step's difficulties are both schedules', and the allowed
samples are those both percentiles allow, counted here from the index files. Then an index made for
another --seed is refused naming its file, and analyze_data's --help and a bad --metrics are checked.

metric_curriculum_check.py OUT_DIR DATA_DIR ARGS_FILE ANALYZE PRETRAIN MPIRUN..."""
import json
import math
import os
import re
import subprocess
import sys

out, data, args_file, analyze, gpt = sys.argv[1:6]
mpi = sys.argv[6:]
os.makedirs(out, exist_ok=True)
flags = [f"@{args_file}", "--data-path", f"{data}/brown_text_document", "--vocab-file", f"{data}/gpt2-vocab.json",
         "--merge-file", f"{data}/gpt2-merges.txt", "--split", "949,50,1"]


def run(cmd, rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if (rc == 0) != (p.returncode == 0):
        sys.exit(f"FAIL: {' '.join(cmd[:6])}... exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


h = run([analyze, "--help"])
assert "--output-prefix" in h and "vocab_rarity" in h, h
e = run([analyze, "--output-prefix", f"{out}/x", "--metrics", "rarity"] + flags, rc=1)
assert re.search(r"analyze_data: error: .*unknown metric 'rarity'.*vocab_rarity", e), e
# Outputs that cannot be written are found before the work, in one line without a doubled rank
# (issue 47 item 15).
# The prefix's folder is created before anything is computed (DeepSpeed's DataAnalyzer makes its
# save_path); one under a regular file cannot be, and is refused in one line before any work.
open(f"{out}/a_file", "w").close()
e = run([analyze, "--output-prefix", f"{out}/a_file/sub/x", "--metrics", "seqlen"] + flags, rc=1)
assert re.search(r"analyze_data: error: .*--output-prefix .*a_file/sub/x: cannot create its folder", e) and \
    "[rank 0] [rank 0]" not in e and "training samples" not in e, e
e = run([analyze, "--output-prefix", f"{out}/x", "--json", out, "--metrics", "seqlen"] + flags, rc=1)
assert re.search(r"analyze_data: error: .*--json .* is a directory", e) and "analyze_data: seqlen" not in e, e

iters = 24  # the vocab_rarity schedule reaches 100 at step 20; logged at 20 and 24
o = run(mpi + [analyze, "--metrics", "vocab_rarity,seqlen", "--output-prefix", f"{out}/brown", "--json", f"{out}/an.json",
               "--train-iters", str(iters)] + flags)
summary = json.load(open(f"{out}/an.json"))
paths = summary["metrics"]["vocab_rarity"]
for p in (paths["index_to_sample_path"], paths["index_to_metric_path"]):
    assert os.path.exists(p + ".bin") and os.path.exists(p + ".json"), p
    assert p in o, f"the analyzer did not print {p}"
N = summary["samples"]
assert summary["ranks"] == 2 and N > 1000, summary


def config(path, sample_path, metric_path):
    cl = {"index_to_sample_path": sample_path, "index_to_metric_path": metric_path, "difficulty_type": "percentile",
          "clustering_type": "schedule_based", "min_difficulty": 10, "max_difficulty": 100, "schedule_type": "fixed_root",
          "schedule_config": {"total_curriculum_step": 20, "difficulty_step": 1, "root_degree": 2}}
    doc = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
           "data_efficiency": {"enabled": True, "seed": 1234, "data_sampling": {
               "enabled": True, "num_workers": 0, "curriculum_learning": {
                   "enabled": True, "data_cluster_path": f"{out}/clusters",
                   "curriculum_metrics": {"vocab_rarity": cl}}}}}
    json.dump(doc, open(path, "w"), indent=1)


config(f"{out}/ds_voc.json", paths["index_to_sample_path"], paths["index_to_metric_path"])
metrics = f"{out}/voc_metrics.jsonl"
if os.path.exists(metrics):
    os.remove(metrics)
o = run(mpi + [gpt] + flags + ["--deepspeed_config", f"{out}/ds_voc.json", "--data-efficiency-curriculum-learning",
                               "--train-iters", str(iters), "--log-interval", "4", "--eval-interval", str(iters),
                               "--eval-iters", "2", "--lr-warmup-iters", "5", "--metrics-file", metrics])
assert re.search(r"> curriculum by vocab_rarity .*percentile difficulty 10 -> 100, fixed_root over 20 steps", o), o[-2000:]
recs = [json.loads(l) for l in open(metrics)]
train = [r for r in recs if r.get("type") == "train"]
assert train and any(r.get("type") == "eval" for r in recs)
for r in train:
    s = r["iteration"]  # iteration s (1-based) draws at difficulty d(s): DeepSpeed's update_difficulty(s)
    d = math.floor((s / 20) ** 0.5 * 90 + 10)
    d = min(d, 100)
    assert r["curriculum_difficulty"] == d, f"iteration {s}: difficulty {r['curriculum_difficulty']}, want {d}"
    want = N if d >= 100 else N // 100 * d
    assert r["curriculum_allowed_samples"] == want, f"iteration {s}: allowed {r['curriculum_allowed_samples']}, want {want}"
first, last = train[0]["lm_loss"], train[-1]["lm_loss"]
assert last < first - 1.0, f"lm loss did not fall: {first} -> {last}"
print(f"difficulty {train[0]['curriculum_difficulty']} -> {train[-1]['curriculum_difficulty']} (percentile), "
      f"allowed {train[0]['curriculum_allowed_samples']} -> {train[-1]['curriculum_allowed_samples']} of {N}; "
      f"lm loss {first:.3f} -> {last:.3f}")

# Two metrics: vocab_rarity (percentile 10 -> 100 over 20 steps, fixed_root 2 as above) and seqlen
# (percentile 50 -> 100 over 8 steps, fixed_linear): a sample is drawn once both allow it.
import struct  # noqa: E402


def ranks(sample_path):
    raw = open(sample_path + ".bin", "rb").read()
    order = struct.unpack(f"<{len(raw) // 8}q", raw)
    r = [0] * len(order)
    for i, s in enumerate(order):
        r[s] = i
    return r


sl = summary["metrics"]["seqlen"]
rr, rs = ranks(paths["index_to_sample_path"]), ranks(sl["index_to_sample_path"])
doc = json.load(open(f"{out}/ds_voc.json"))
cms = doc["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]
cms["seqlen"] = {"index_to_sample_path": sl["index_to_sample_path"], "index_to_metric_path": sl["index_to_metric_path"],
                 "difficulty_type": "percentile", "clustering_type": "schedule_based", "min_difficulty": 50,
                 "max_difficulty": 100, "schedule_type": "fixed_linear",
                 "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 1}}
json.dump(doc, open(f"{out}/ds_two.json", "w"), indent=1)
metrics2 = f"{out}/two_metrics.jsonl"
if os.path.exists(metrics2):
    os.remove(metrics2)
o = run(mpi + [gpt] + flags + ["--deepspeed_config", f"{out}/ds_two.json", "--train-iters", "10", "--log-interval", "1",
                               "--eval-iters", "0", "--lr-warmup-iters", "5", "--metrics-file", metrics2])
assert re.search(r"> curriculum by seqlen .*percentile difficulty 50 -> 100", o) and \
    re.search(r"> curriculum by vocab_rarity .*percentile difficulty 10 -> 100", o), o[-2000:]
train2 = [json.loads(l) for l in open(metrics2)]
train2 = [r for r in train2 if r.get("type") == "train"]
assert len(train2) == 10, len(train2)
for r in train2:
    s = r["iteration"]
    dv = min(math.floor((s / 20) ** 0.5 * 90 + 10), 100)
    ds = min(math.floor(s / 8 * 50 + 50), 100)
    assert r["curriculum_difficulties"] == {"vocab_rarity": dv, "seqlen": ds}, (s, r["curriculum_difficulties"])
    cv = N if dv >= 100 else N // 100 * dv
    cs = N if ds >= 100 else N // 100 * ds
    both = sum(1 for i in range(N) if rr[i] < cv and rs[i] < cs)
    assert r["curriculum_allowed_samples"] == both, f"iteration {s}: allowed {r['curriculum_allowed_samples']}, want {both}"
print(f"two metrics: allowed {train2[0]['curriculum_allowed_samples']} -> {train2[-1]['curriculum_allowed_samples']} of {N}, "
      "each the count both percentiles allow")

# An index made for another training set (another --seed: other samples) is refused by name.
# (into a folder that does not exist yet: analyze_data creates it)
run([analyze, "--metrics", "vocab_rarity", "--output-prefix", f"{out}/new_dir/other", "--train-iters", str(iters), "--seed", "7"] + flags)
config(f"{out}/ds_other.json", f"{out}/new_dir/other_vocab_rarity_index_to_sample", f"{out}/new_dir/other_vocab_rarity_index_to_metric")
e = run([gpt] + flags + ["--deepspeed_config", f"{out}/ds_other.json", "--train-iters", str(iters)], rc=1)
assert re.search(r"pretrain_gpt: error: .*was made for \d+ samples of 128 tokens \(seed 7.*other_vocab_rarity_index_to_sample\.json.*"
                 r"run analyze_data with this run's data flags", e), e
assert "MPI_ABORT" not in e, "the refusal aborted the job instead of a clean exit"
print("an index for another training set is refused naming its file")
print("1 passed, 0 failed")
