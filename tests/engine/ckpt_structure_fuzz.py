#!/usr/bin/env python3
"""Seeded structural fuzzing of checkpoint files (issue 47, "what must be shown": the HDF5 fuzz
extended to links, virtual and external datasets, chunked layouts and attributes).

ckpt_structure_fuzz.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --generate GENERATE --args ARGS --mpi "MPIEXEC -n 2 ..."
                       --workdir DIR   (HPCT_CKPT_FUZZ_CASES, HPCT_CKPT_FUZZ_SEED: how many, which)

libFuzzer mutates bytes, and byte-level damage to an HDF5 file mostly tests libhdf5's own parser;
what a crafted checkpoint does is change its *structure*. Each case applies 1-3 operators, drawn
with a fixed seed, to a good checkpoint of the tiny GPT, through h5py:
  soft link, external link, virtual dataset, external storage, hard-link alias, chunked or compact
  storage, another element type (f16, f64, int32, big-endian f32), another shape, a deleted or
  extra dataset, and root or tensor attributes replaced by another type (float, string, array,
  huge integer) or deleted.
Then `hpct_ckpt verify` and `generate` must each end within 20 s with exit 0, or exit 1 and exactly
one error line; never a signal, a hang or another exit code. Every 8th case `pretrain_gpt --load`
runs on 2 ranks under the same rule (60 s). A case whose edits are all harmless (chunked/compact)
must be accepted by all. Failing cases are printed with their operators to reproduce.
"""
import concurrent.futures
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py", "numpy")
import h5py  # noqa: E402
import numpy as np  # noqa: E402

c = Checks("--gpt", "--tool", "--generate", "--args", "--mpi", "--workdir")
a, check = c.args, c.check
CASES = int(os.environ.get("HPCT_CKPT_FUZZ_CASES", "64"))  # about 1 s each; more with HPCT_CKPT_FUZZ_CASES
rng = random.Random(int(os.environ.get("HPCT_CKPT_FUZZ_SEED", "20261128")))
base = ["--mock-data", "--vocab-size", "512", "--micro-batch-size", "2", "--global-batch-size", "4", "--log-interval", "1",
        "--eval-iters", "0", "--num-layers", "2", "--lr-decay-iters", "100"]
good = os.path.join(a.workdir, "good")
p = subprocess.run([a.gpt, "@" + a.args, *base, "--train-iters", "2", "--save", good], capture_output=True, text=True)
if p.returncode != 0:
    print(p.stdout[-1000:], p.stderr[-1000:])
    sys.exit(1)
FILE = "iter_0000002.h5"
other = os.path.join(a.workdir, "other.h5")
secret = os.path.join(a.workdir, "secret.bin")
with open(secret, "wb") as s:
    s.write(b"TOPSECRET" * 4096)
with h5py.File(os.path.join(good, FILE), "r") as f:
    datasets = []
    f.visititems(lambda n, o: datasets.append("/" + n) if isinstance(o, h5py.Dataset) else None)
    root_attrs = list(f.attrs.keys())
    with h5py.File(other, "w") as g:
        for d in datasets:
            g.create_dataset(d, data=f[d][...])


def copy_attrs(src, dst):
    for k, v in src.items():
        dst[k] = v


def relayout(f, d, **kw):
    x, attrs = f[d][...], dict(f[d].attrs)
    del f[d]
    if kw.get("compact"):
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        ds = h5py.h5d.create(f.id, d.encode(), h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(x.shape), dcpl=dcpl)
        ds.write(h5py.h5s.ALL, h5py.h5s.ALL, x.astype("<f4"))
    else:
        f.create_dataset(d, data=x.astype(kw.get("dtype", "<f4")).reshape(kw.get("shape", x.shape)),
                         chunks=kw.get("chunks"))
    copy_attrs(attrs, f[d].attrs)


def op_soft(f, d):
    t = rng.choice(datasets)
    if t != d:
        del f[d]
        f[d] = h5py.SoftLink(t)


def op_external_link(f, d):
    del f[d]
    f[d] = h5py.ExternalLink(other, d)


def op_virtual(f, d):
    shape = f[d].shape
    del f[d]
    layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
    layout[...] = h5py.VirtualSource(other, d, shape=shape)
    f.create_virtual_dataset(d, layout)


def op_external_storage(f, d):
    x = f[d]
    shape, nbytes, attrs = x.shape, x.size * 4, dict(x.attrs)
    del f[d]
    f.create_dataset(d, shape=shape, dtype="<f4", external=[(secret, 0, nbytes)])
    copy_attrs(attrs, f[d].attrs)


def op_alias(f, d):
    t = rng.choice(datasets)
    if t != d and f[t].shape == f[d].shape:
        del f[d]
        f[d] = f[t]


def op_chunked(f, d):
    shape = f[d].shape
    relayout(f, d, chunks=tuple(max(1, s // rng.choice([1, 2, 4])) for s in shape))


def op_compact(f, d):
    if f[d].size * 4 < 60000:
        relayout(f, d, compact=True)


def op_dtype(f, d):
    relayout(f, d, dtype=rng.choice(["<f2", "<f8", "<i4", ">f4"]))


def op_shape(f, d):
    x = f[d]
    n = x.size
    relayout(f, d, shape=rng.choice([(n,), (1, n)] + ([(x.shape[1], x.shape[0])] if x.ndim == 2 else [])))


def op_delete(f, d):
    del f[d]


def op_extra(f, d):
    f.create_dataset(d + "_extra", data=np.zeros(4, "<f4"))


def weird_value():
    return rng.choice([np.float64(4.7), np.float64(float("nan")), "text", np.arange(3), np.int64(2 ** 62), np.uint64(0),
                       np.int64(-1), "{\"num_layers\": 1000000}", b"\xff\xfe"])


def op_tensor_attr(f, d):
    if rng.random() < 0.3 and "checksum" in f[d].attrs:
        del f[d].attrs["checksum"]
    else:
        f[d].attrs["checksum"] = weird_value()


def op_root_attr(f, d):
    k = rng.choice(root_attrs)
    if rng.random() < 0.3:
        del f.attrs[k]
    else:
        f.attrs[k] = weird_value()


OPS = [op_soft, op_external_link, op_virtual, op_external_storage, op_alias, op_chunked, op_compact, op_dtype, op_shape,
       op_delete, op_extra, op_tensor_attr, op_root_attr]
HARMLESS = {op_chunked, op_compact}


def run(cmd, timeout):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired:
        return "timeout", ""


def judge(tag, what, rc, out, harmless):
    errs = [l for l in out.splitlines() if "error:" in l]
    ok = rc == 0 if harmless else (rc == 0 or (rc == 1 and len(errs) == 1))
    if not ok:
        check(False, f"{tag}: {what} exit {rc} with {len(errs)} error lines: {errs[:2] or out[-300:]}")
    return ok


# The cases are drawn and written one after another (the seeded draws keep their order), then
# their readers run two cases at a time (each reader is one process, the 2-rank --load two; the
# time limits leave room for sharing the cores), judged in case order.
cases = []
for i in range(CASES):
    ops = [rng.choice(OPS) for _ in range(rng.randint(1, 3))]
    targets = [rng.choice(datasets) for _ in ops]
    tag = f"case {i}: " + ", ".join(f"{o.__name__[3:]}({t})" for o, t in zip(ops, targets))
    d = os.path.join(a.workdir, f"case_{i}")
    shutil.copytree(good, d)
    try:
        with h5py.File(os.path.join(d, FILE), "r+") as f:
            for o, t in zip(ops, targets):
                if t in f or o is op_root_attr:
                    o(f, t)
    except Exception as e:  # noqa: BLE001  an edit h5py refuses (a dataset gone by an earlier op): skip it
        print(f"skip {tag}: {e}")
        shutil.rmtree(d)
        continue
    cases.append((i, tag, d, all(o in HARMLESS for o in ops)))


def readers(i, d):
    """Each reader's (what, rc, output) on case i's checkpoint directory d."""
    out = [("verify", *run([a.tool, "verify", d], 20)),
           ("generate", *run([a.generate, "--load", d, "--prompt-ids", "1,2", "--max-new-tokens", "1"], 20))]
    if i % 8 == 0:
        out.append(("--load on 2 ranks", *run([*a.mpi.split(), a.gpt, "@" + a.args, *base, "--train-iters", "3", "--load", d],
                                               60)))
    return out


bad = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = [pool.submit(readers, i, d) for i, _, d, _ in cases]
    for (i, tag, d, harmless), res in zip(cases, results):
        ok = True
        for what, rc, out in res.result():
            ok = judge(tag, what, rc, out, harmless) and ok
        bad += not ok
        if ok:
            shutil.rmtree(d)
check(bad == 0, f"{CASES} structural cases: every reader took the file or refused it in one line, in time ({bad} did not)")
c.finish()
