#!/usr/bin/env python3
"""pretrain_gpt checkpoints as a user meets them, with 2 MPI ranks and the tiny model on mock data.

ckpt_app_check.py SCENARIO --gpt PRETRAIN_GPT --args ARGS_FILE --workdir DIR --mpi "MPIEXEC -n 2 ..."

kill   : a rank is SIGKILLed in the middle of the second save (after its tensors are written; and,
         in a second round, after the file is renamed but before `latest` moves). The previous
         checkpoint stays intact and `latest` names it; the next run resumes from it and reaches
         the uninterrupted run's final loss exactly.
signal : SIGUSR1 to a running job: it saves at the next iteration boundary and exits with code 75;
         the next run resumes there. Again with --async-save and a save every 2 iterations: every
         background save started before the signal is complete and verifies (hpct_ckpt, when
         --tool is given), and `latest` names the stop save.
tool   : hpct_ckpt list / verify on a saved checkpoint; a flipped byte in one tensor fails verify
         naming that tensor. The standard tools read the same file: `h5ls -r` lists every tensor
         with its full shape, `h5dump -H` shows the attributes, and h5py reads every dataset, whose
         values give back the checksum hpctrain stored (recomputed here with numpy).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("scenario", choices=["kill", "signal", "tool"])
ap.add_argument("--tool")
ap.add_argument("--gpt", required=True)
ap.add_argument("--args", required=True)
ap.add_argument("--workdir", required=True)
ap.add_argument("--mpi", required=True)
a = ap.parse_args()
mpi = a.mpi.split()
base = [a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--micro-batch-size", "4", "--global-batch-size", "8",
        "--log-interval", "1", "--eval-iters", "0", "--lr-decay-iters", "100"]  # one schedule for every run length
errors = []


def run(extra, env_extra=None, expect_rc=0, tag=""):
    env = dict(os.environ)
    env.update(env_extra or {})
    p = subprocess.run(mpi + base + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=600)
    ok = (p.returncode == expect_rc) if expect_rc is not None else (p.returncode != 0)
    if not ok:
        print(p.stdout[-4000:])
        errors.append(f"{tag}: exit code {p.returncode}, expected {'non-zero' if expect_rc is None else expect_rc}")
    return p.stdout


def losses(metrics):
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(metrics)) if r.get("type") == "train"}


def latest(d):
    with open(os.path.join(d, "latest")) as f:
        return f.read().strip()


shutil.rmtree(a.workdir, ignore_errors=True)
os.makedirs(a.workdir)
w = a.workdir

if a.scenario == "kill":
    ref = os.path.join(w, "ref.jsonl")
    run(["--train-iters", "10", "--metrics-file", ref], tag="uninterrupted")
    want = losses(ref)
    for point, rank in [("after_tensors", "1"), ("before_latest", "0")]:
        d = os.path.join(w, "ckpt_" + point)
        m1 = os.path.join(w, point + "_1.jsonl")
        out = run(["--train-iters", "10", "--save", d, "--save-interval", "5", "--metrics-file", m1],
                  env_extra={"HPCT_FAULT_CKPT": f"{rank}:{point}:10"}, expect_rc=None, tag=f"killed at {point}")
        if "HPCT_FAULT_CKPT: killing this rank" not in out:
            errors.append(f"{point}: the fault was not injected")
        if latest(d) != "iter_0000005.h5":
            errors.append(f"{point}: latest is {latest(d)!r} after the crash, expected iter_0000005.h5")
        if not os.path.exists(os.path.join(d, "iter_0000005.h5")):
            errors.append(f"{point}: the previous checkpoint is gone")
        m2 = os.path.join(w, point + "_2.jsonl")
        out = run(["--train-iters", "10", "--save", d, "--load", d, "--metrics-file", m2], tag=f"resume after {point}")
        if not re.search(r"successfully loaded checkpoint from .*iter_0000005\.h5 at iteration 5", out):
            errors.append(f"{point}: the resumed run did not load iteration 5")
        got = losses(m2)
        if sorted(got) != list(range(6, 11)):
            errors.append(f"{point}: resumed run logged iterations {sorted(got)}, expected 6..10")
        for it in range(6, 11):
            if got.get(it) != want[it]:
                errors.append(f"{point}: iteration {it} loss {got.get(it)} != uninterrupted {want[it]}")
        if latest(d) != "iter_0000010.h5":
            errors.append(f"{point}: latest is {latest(d)!r} after the resumed run, expected iter_0000010.h5")
        print(f"{point}: crash left latest=iter_0000005.h5; resume matched the uninterrupted losses 6..10 exactly")
elif a.scenario == "tool":
    d = os.path.join(w, "ckpt")
    run(["--train-iters", "3", "--save", d], tag="save")
    t = subprocess.run([a.tool, "verify", d, "--json", os.path.join(w, "v.json")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    print(t.stdout[-2500:])
    if t.returncode != 0 or "# Result: OK" not in t.stdout:
        errors.append(f"tool: verify of a good checkpoint failed (exit {t.returncode})")
    v = json.load(open(os.path.join(w, "v.json")))
    if v.get("iteration") != 3 or len(v.get("tensors", [])) < 3 or v.get("result") != "OK":
        errors.append(f"tool: JSON lacks the iteration, tensors or result: {str(v)[:300]}")
    f = os.path.join(d, "iter_0000003.h5")
    # ---- the standard HDF5 tools read it ----
    ls = subprocess.run(["h5ls", "-r", f], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listed = {m.group(1): [int(x) for x in m.group(2).split(", ")]
              for m in re.finditer(r"^(\S+)\s+Dataset \{([0-9, ]+)\}$", ls.stdout, re.M)}
    for x in v["tensors"]:
        if listed.get(x["name"]) != x["shape"]:
            errors.append(f"h5ls -r: {x['name']} listed as {listed.get(x['name'])}, expected {x['shape']}")
    dump = subprocess.run(["h5dump", "-H", f], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if dump.returncode != 0 or not re.search(r'ATTRIBUTE "iteration" \{\s*DATATYPE\s+H5T_STD_I64LE', dump.stdout):
        errors.append(f"h5dump -H: exit {dump.returncode}, no 64-bit integer iteration attribute")
    it = subprocess.run(["h5dump", "-a", "/iteration", f], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if it.returncode != 0 or not re.search(r"\(0\): 3\s", it.stdout):
        errors.append(f"h5dump -a /iteration: exit {it.returncode}, not 3: {it.stdout[-300:]}")
    # h5py is Debian's python3-h5py (scripts/install_deps.sh), in the system interpreter, which
    # may not be the one running this script (e.g. under pyenv).
    here = os.path.dirname(os.path.abspath(__file__))
    for py in [sys.executable, "/usr/bin/python3"]:
        if subprocess.run([py, "-c", "import h5py, numpy"], capture_output=True).returncode == 0:
            hp = subprocess.run([py, os.path.join(here, "h5py_read_check.py"), f, os.path.join(w, "v.json")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            print(hp.stdout[-2000:])
            if hp.returncode != 0:
                errors.append("h5py: " + (hp.stdout.strip().splitlines() or ["failed"])[-1])
            break
    else:
        errors.append("h5py: not importable (scripts/install_deps.sh installs python3-h5py)")
    print(f"tool: h5ls -r and h5dump -H list all {len(v['tensors'])} tensors and the attributes; h5dump -a /iteration reads 3")
    victim = "/model/final_layernorm/weight"
    if not any(x["name"] == victim for x in v.get("tensors", [])):
        errors.append(f"tool: no {victim} listed")
    # Flip bytes inside one tensor's data (its file offset is in the tool's JSON), then verify again.
    off = next(x["offset"] for x in v["tensors"] if x["name"] == victim)
    data = bytearray(open(f, "rb").read())
    data[off + 8:off + 16] = bytes(b ^ 0xFF for b in data[off + 8:off + 16])
    bad = os.path.join(w, "bad.h5")
    open(bad, "wb").write(bytes(data))
    t2 = subprocess.run([a.tool, "verify", bad], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(t2.stdout[-1500:])
    want_line = "FAILED (1 of " + str(len(v["tensors"])) + " cases: " + victim + ": checksum FAILED)"
    if t2.returncode != 1 or want_line not in t2.stdout:
        errors.append(f"tool: a corrupted tensor was not named by verify (exit {t2.returncode})")
    print("tool: verify OK on a good checkpoint, names the one corrupted tensor in a bad copy")
else:
    # Twice: plain, and with background saves every 2 iterations in flight when the signal lands
    # (the stop save is synchronous and waits for the background one: both must be complete).
    for tag, extra in [("signal", []), ("signal+async", ["--async-save", "--save-interval", "2"])]:
        d = os.path.join(w, "ckpt_" + tag.replace("+", "_"))
        summary = os.path.join(w, tag.replace("+", "_") + "_summary.json")
        cmd = mpi + base + ["--train-iters", "100000", "--save", d, "--json", summary] + extra
        # With background saves, hold each one's copy back (test-only) so one is still in flight
        # at the next iteration boundaries, where the signal may land.
        env = dict(os.environ, **({"HPCT_TEST_ASYNC_COPY_DELAY_MS": "300"} if extra else {}))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        out, t0 = "", time.time()
        while time.time() - t0 < 120:
            line = p.stdout.readline()
            if not line:
                break
            out += line
            if re.search(r"iteration +5/", line):
                p.send_signal(signal.SIGUSR1)  # mpirun forwards SIGUSR1 to every rank
                break
        rest, _ = p.communicate(timeout=300)
        out += rest
        print(out[-3000:])
        if p.returncode != 75:
            errors.append(f"{tag}: exit code {p.returncode}, expected 75")
        if "stop requested by a signal" not in out:
            errors.append(f"{tag}: no 'stop requested by a signal' line")
        try:
            s = json.load(open(summary))
            k = s["iterations"]
            if s["exit_reason"] != "signal" or k < 5:
                errors.append(f"{tag}: summary says {s['exit_reason']} after {k} iterations")
            if latest(d) != f"iter_{k:07d}.h5":
                errors.append(f"{tag}: latest is {latest(d)!r}, expected iteration {k}")
            if extra:
                # Every background save started before the signal was published, whole.
                saved = sorted(f for f in os.listdir(d) if f.endswith(".h5"))
                want = [f"iter_{i:07d}.h5" for i in range(2, k + 1, 2)] + ([f"iter_{k:07d}.h5"] if k % 2 else [])
                if saved != want:
                    errors.append(f"{tag}: checkpoints {saved}, expected {want}")
                if any(f.endswith(".tmp") for f in os.listdir(d)):
                    errors.append(f"{tag}: a temporary file was left: {os.listdir(d)}")
                for f in saved:
                    v = subprocess.run([a.tool, "verify", os.path.join(d, f)], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True) if a.tool else None
                    if v is not None and v.returncode != 0:
                        errors.append(f"{tag}: {f} does not verify: {v.stdout[-300:]}")
            out2 = run(["--train-iters", str(k + 2), "--save", d, "--load", d], tag=f"{tag}: resume")
            if f"at iteration {k}" not in out2 or not re.search(rf"iteration +{k + 2}/", out2):
                errors.append(f"{tag}: the resumed run did not continue from {k} to {k + 2}")
            print(f"{tag}: saved at iteration {k}, exit 75, resumed to {k + 2}")
        except (OSError, KeyError, ValueError) as e:
            errors.append(f"{tag}: {e}")

for e in errors:
    print("FAIL:", e)
if not errors and os.environ.get("HPCT_KEEP_TEST_OUTPUT") != "1":
    shutil.rmtree(w, ignore_errors=True)  # as checklib's finish: a passing run's checkpoints go
sys.exit(1 if errors else 0)
