#!/usr/bin/env python3
"""nvme_bench interrupted in the middle of a write (SIGTERM, as scancel sends; SIGINT, as Ctrl-C):
it dies of the signal and its file is gone, unless --keep, where the file stays. Started under
nohup (SIGHUP ignored), a SIGHUP leaves it running.

interrupt_check.py --nb BIN --dir DIR"""
import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--nb", required=True)
ap.add_argument("--dir", required=True)
a = ap.parse_args()
fails = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        fails.append(msg)


def interrupted(sig, keep, nohup=False):
    d = os.path.join(a.dir, f"{signal.Signals(sig).name}{'_keep' if keep else ''}{'_nohup' if nohup else ''}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # 4 KiB requests one at a time: long enough to be caught in the middle on any disk.
    cmd = [a.nb, "--path", d, "--size", "512M", "--mode", "write", "--block-size", "4K", "--queue-depth", "1",
           "--engine", "psync"] + (["--keep"] if keep else [])
    ign = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ign)
    t0 = time.time()
    files = []
    while time.time() - t0 < 60 and p.poll() is None:
        files = glob.glob(os.path.join(d, "nvme_bench.*.dat"))
        if files and os.path.getsize(files[0]) > 0:
            break
        time.sleep(0.01)
    check(bool(files) and p.poll() is None, f"{sig.name}{' --keep' if keep else ''}: the write was under way when signalled")
    time.sleep(0.2)
    if nohup:
        p.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        check(p.poll() is None, "nohup: a SIGHUP ignored at start stays ignored")
    p.send_signal(sig)
    try:
        out, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        check(False, f"{sig.name}: nvme_bench still running 60 s after the signal")
    check(p.returncode == -sig, f"{sig.name}: died of the signal (returncode {p.returncode}, expected {-sig})")
    left = glob.glob(os.path.join(d, "nvme_bench.*.dat"))
    if keep:
        check(len(left) == 1, f"{sig.name} --keep: the file stays ({left})")
    else:
        check(not left, f"{sig.name}: the file is removed ({left})")
    if p.returncode != -sig:
        print(out[-2000:])
    shutil.rmtree(d, ignore_errors=True)


interrupted(signal.SIGTERM, keep=False)
interrupted(signal.SIGINT, keep=False)
interrupted(signal.SIGTERM, keep=True)
interrupted(signal.SIGTERM, keep=False, nohup=True)
sys.exit(1 if fails else 0)
