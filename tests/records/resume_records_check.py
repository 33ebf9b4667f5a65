#!/usr/bin/env python3
"""A run's records across kills and resumes, as a Slurm user meets them (2 MPI ranks, tiny GPT).

resume_records_check.py --gpt PRETRAIN_GPT --mpi "MPIEXEC -n 2 ..." --workdir DIR --plot-out PNG

Three segments write the same --metrics-file, --tensorboard-dir and ds_config csv_monitor:
  1. a fresh run, SIGKILLed (mpirun and every rank) once it has logged iterations past its
     latest checkpoint;
  2. a resume from that checkpoint, killed the same way;
  3. a resume that runs to the end.
Then:
  - the metrics file holds every iteration 1..N once, in order, with three "segment" records
    (resumed_from 0, then each checkpoint's iteration), each with the resolved config, version,
    git commit, hosts and layout; the records a kill left past its checkpoint are in
    <metrics>.discarded, and the segment records count them;
  - the TensorBoard event files decode (python3-protobuf, TensorBoard's public field numbers,
    every record's masked CRC-32C checked) to the same per-iteration lm loss, learning rate and
    grad norm as the metrics file (float32 of the same double: relative 1e-6), once per
    iteration after TensorBoard's purge at each segment's SessionLog START;
  - the CSV files hold the same lm loss, once per iteration;
  - the phase timers of every rank (--timing-log-option all) sum to within 10% of that rank's
    iteration time (the first record of a segment is left out: it carries start-up);
  - the JSON summary carries the last segment's provenance;
  - the plot tool draws a PNG of the stitched run.
"""
import glob
import json
import math
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Debian's python3-protobuf lives in the system interpreter, which may not be the one running this
# script (e.g. under pyenv): run again with it.
try:
    import google.protobuf  # noqa: F401
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import tfevents  # noqa: E402
from checklib import Checks  # noqa: E402

c = Checks("--gpt", "--mpi", "--workdir", "--plot-out")
a = c.args
check = c.check

w = a.workdir
metrics = os.path.join(w, "metrics.jsonl")
tb = os.path.join(w, "tb")
ckpt = os.path.join(w, "ckpt")
summary = os.path.join(w, "summary.json")
ds = os.path.join(w, "ds_config.json")
with open(ds, "w") as f:
    json.dump({"train_micro_batch_size_per_gpu": 4, "csv_monitor": {"enabled": True, "output_path": w, "job_name": "csv"}}, f)
N = 60
args = [a.gpt, "--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
        "--global-batch-size", "8", "--lr", "1e-3", "--mock-data", "--vocab-size", "512",
        "--train-iters", str(N), "--log-interval", "1", "--eval-iters", "0", "--save-interval", "4",
        "--save", ckpt, "--load", ckpt, "--metrics-file", metrics, "--json", summary,
        "--tensorboard-dir", tb, "--log-timers-to-tensorboard", "--timing-log-level", "2", "--timing-log-option", "all",
        "--deepspeed_config", ds]


def records():
    out = []
    with open(metrics) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a kill may leave half a line
    return out


def latest_iteration():
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            name = f.read().strip()
        return int(name.split("_")[-1].split(".")[0])
    except (OSError, ValueError):
        return 0


def killed_segment(tag):
    """Starts a segment and SIGKILLs it once it has logged 3 iterations past its latest checkpoint
    (and past the point it resumed from). Returns (resumed_from, last_logged)."""
    start = latest_iteration()
    p = subprocess.Popen(a.mpi.split() + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.time() + 300
    last = 0
    while time.time() < deadline and p.poll() is None:
        its = [r["iteration"] for r in records() if r.get("type") == "train"] if os.path.exists(metrics) else []
        last = max(its) if its else 0
        ck = latest_iteration()
        if ck > start and last >= ck + 3:
            break
        time.sleep(0.005)
    if p.poll() is not None:
        print(p.stdout.read()[-3000:])
        check(False, f"{tag}: the run ended (exit {p.returncode}) before it could be killed")
        return start, last
    # mpirun and every rank at once (a node lost, not a clean stop). The ranks are not in mpirun's
    # process group; every one of them has this run's metrics path on its command line.
    os.killpg(p.pid, signal.SIGKILL)
    subprocess.run(["pkill", "-KILL", "-f", metrics])
    p.wait()
    p.stdout.close()
    while subprocess.run(["pgrep", "-f", metrics], capture_output=True).returncode == 0:
        time.sleep(0.05)
    print(f"{tag}: resumed from {start}, killed after logging iteration {last} (latest checkpoint {latest_iteration()})")
    return start, last


r1 = killed_segment("segment 1")
r2 = killed_segment("segment 2")
resume3 = latest_iteration()
p = subprocess.run(a.mpi.split() + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
if not check(p.returncode == 0, f"segment 3 (resumed from {resume3}) runs to the end: exit {p.returncode}"):
    print(p.stdout[-4000:])
    sys.exit(1)

# ---- the metrics file ----
recs = records()
with open(metrics) as f:
    check(len(recs) == sum(1 for line in f if line.strip()), "every line of the metrics file is one JSON record")
train = [r for r in recs if r["type"] == "train"]
segs = [r for r in recs if r["type"] == "segment"]
check([r["iteration"] for r in train] == list(range(1, N + 1)), f"train records are iterations 1..{N} once, in order")
check(len(segs) == 3, f"three segment records (got {len(segs)})")
check([s.get("resumed_from_iteration") for s in segs] == [0, r2[0], resume3],
      f"segments resumed from 0, {r2[0]}, {resume3}: {[s.get('resumed_from_iteration') for s in segs]}")
check([s.get("segment") for s in segs] == [1, 2, 3], "segments are numbered 1, 2, 3")
for s in segs:
    for key in ("config", "version", "git_commit", "hosts", "layout", "time", "wall_time"):
        check(key in s and s[key] not in (None, "", []), f"segment {s.get('segment')} has '{key}'")
    check(len(s.get("hosts", [])) == 2 and s.get("layout", {}).get("world_size") == 2, f"segment {s.get('segment')}: two ranks' hosts")
    check(s.get("config", {}).get("train_iters") == N, f"segment {s.get('segment')}: the resolved config")
order = [r["type"] for r in recs]
check(order.index("segment") == 0 and all(order.index("segment", i) < order.index("train", i) for i in [0]),
      "the file starts with a segment record")
# Where each segment's records begin: right after its segment record, at resumed_from + 1.
for s in segs:
    i = recs.index(s)
    nxt = next((r for r in recs[i + 1:] if r["type"] == "train"), None)
    check(nxt is not None and nxt["iteration"] == s["resumed_from_iteration"] + 1,
          f"segment {s['segment']}'s first train record is iteration {s['resumed_from_iteration'] + 1}")
dropped = [json.loads(line) for line in open(metrics + ".discarded") if line.strip().startswith("{")] \
    if os.path.exists(metrics + ".discarded") else []
check(sum(s["discarded_records"] for s in segs) >= len(dropped) > 0 and
      all(r.get("iteration", 0) > r2[0] or r.get("iteration", 0) > resume3 for r in dropped if r.get("type") == "train"),
      f"{len(dropped)} records past a checkpoint moved to {os.path.basename(metrics)}.discarded and counted")
check(any(r.get("type") == "train" and r["iteration"] > r2[0] for r in dropped),
      "the first kill's records past its checkpoint are among them")

# ---- TensorBoard ----
sc = tfevents.scalars(tb)  # CRCs are checked while reading
by_it = {r["iteration"]: r for r in train}
for tag, key in [("lm-loss-training/lm loss", "lm_loss"), ("learning-rate/learning-rate", "learning_rate"),
                 ("grad-norm/grad-norm", "grad_norm")]:
    pts = sc.get(tag, [])
    check([s for s, _, _ in pts] == list(range(1, N + 1)), f"TensorBoard '{tag}': steps 1..{N} once after the purge")
    bad = [(s, v, by_it[s][key]) for s, v, _ in pts if s in by_it and
           not math.isclose(v, by_it[s][key], rel_tol=1e-6, abs_tol=1e-12)]
    check(not bad, f"TensorBoard '{tag}' equals the metrics file's {key} (float32): {bad[:3]}")
tp = sc.get("throughput/tokens per second", [])
check([s for s, _, _ in tp] == list(range(1, N + 1)) and
      all(math.isclose(v, by_it[s]["tokens_per_second"], rel_tol=1e-6) for s, v, _ in tp),
      "TensorBoard tokens/s equals the metrics file's")
check(len(sc.get("timers/forward", [])) == N, "TensorBoard has the timers (--log-timers-to-tensorboard)")
check(len(glob.glob(os.path.join(tb, "events.out.tfevents.*"))) == 3, "one event file per segment")

# ---- CSV (ds_config csv_monitor) ----
csv = os.path.join(w, "csv", "lm-loss-training_lm_loss.csv")
rows = open(csv).read().split("\n") if os.path.exists(csv) else []
check(rows[:1] == ["step,lm loss"], f"{csv}: header 'step,lm loss'")
vals = [row.split(",") for row in rows[1:] if row]
check([int(s) for s, _ in vals] == list(range(1, N + 1)) and
      all(math.isclose(float(v), by_it[int(s)]["lm_loss"], rel_tol=1e-8) for s, v in vals),
      "the CSV lm loss: iterations 1..N once, values of the metrics file")

# ---- timers ----
firsts = {s["resumed_from_iteration"] + 1 for s in segs}
worst = 0.0
for r in train:
    if r["iteration"] in firsts:
        continue
    t = r["timers_ms"]
    for rank in range(2):
        parts = sum(t[k]["ranks"][rank] for k in ("data", "forward", "backward", "grad_reduce", "optimizer"))
        whole = t["iteration"]["ranks"][rank]
        worst = max(worst, abs(parts - whole) / whole)
check(worst <= 0.10, f"on each rank the phase timers sum to the iteration time within 10% (worst {worst:.1%})")
check(all(r["timers_ms"]["checkpoint"]["max"] > 0 for r in train if r["iteration"] % 4 == 1 and r["iteration"] not in firsts),
      "the checkpoint timer counts the saves (the interval after each save)")
check(all(r.get("memory", {}).get("peak_rss_bytes", 0) > 1e6 for r in train), "every train record has the peak memory")

# ---- summary ----
s = json.load(open(summary))
check(s.get("provenance", {}).get("resumed_from_iteration") == resume3 and "config" in s.get("provenance", {}),
      "the JSON summary carries the last segment's provenance")

# ---- the plot tool on the stitched run ----
if a.plot_out:
    py = next((p for p in [sys.executable, "/usr/bin/python3"]
               if subprocess.run([p, "-c", "import matplotlib"], capture_output=True).returncode == 0), None)
    if check(py is not None, "an interpreter with matplotlib (python3-matplotlib)"):
        out = subprocess.run([py, os.path.join(HERE, "plot_check.py"), metrics, a.plot_out],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(out.stdout[-2000:])
        check(out.returncode == 0, f"plot_check.py on the run's metrics: exit {out.returncode}")

c.finish()
