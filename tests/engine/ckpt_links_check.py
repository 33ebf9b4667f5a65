#!/usr/bin/env python3
"""A checkpoint is data, never a pointer to other files (issue 47, High items 1 and 2).

ckpt_links_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --generate GENERATE --args ARGS --mpi "MPIEXEC -n 2 ..." --workdir DIR

A good checkpoint of the tiny GPT is edited with h5py (as the reviewer made them) so that one
tensor, /model/final_layernorm/bias, is
  - a virtual dataset over another file's dataset (which deadlocked --load on 2 ranks: opening a
    virtual dataset is collective in a parallel file, and the ranks read different tensors),
  - an external link to another file's dataset,
  - a dataset with external storage over a "secret" local file (which `export` and `generate`
    used with exit 0: a crafted .h5 could publish local files).
Each must be refused, with one error line naming the tensor and why, and exit 1, by `pretrain_gpt
--load` on 1 rank and on 2 ranks (within 60 s: no hang), by `hpct_ckpt verify` and `export`, and
by `generate`; no exported file may hold the secret's bytes. The good checkpoint still loads.
"""
import os
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
base = ["--mock-data", "--vocab-size", "512", "--micro-batch-size", "2", "--global-batch-size", "4", "--log-interval", "1",
        "--eval-iters", "0", "--num-layers", "2", "--lr-decay-iters", "100"]
TENSOR = "/model/final_layernorm/bias"


def run(cmd, timeout=60):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        return "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")


good = os.path.join(a.workdir, "good")
rc, out = run([a.gpt, "@" + a.args, *base, "--train-iters", "2", "--save", good])
check(rc == 0, f"a good checkpoint is saved (exit {rc})")
with h5py.File(os.path.join(good, "iter_0000002.h5"), "r") as f:
    shape, values = f[TENSOR].shape, f[TENSOR][...]
secret = os.path.join(a.workdir, "secret.bin")
with open(secret, "wb") as s:
    s.write(b"TOPSECRET" * (values.nbytes // 9 + 1))
other = os.path.join(a.workdir, "other.h5")
with h5py.File(other, "w") as f:
    f.create_dataset("x", data=values)


def virtual(f):
    del f[TENSOR]
    layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
    layout[...] = h5py.VirtualSource(other, "x", shape=shape)
    f.create_virtual_dataset(TENSOR, layout)


def external_link(f):
    del f[TENSOR]
    f[TENSOR] = h5py.ExternalLink(other, "/x")


def external_storage(f):
    del f[TENSOR]
    f.create_dataset(TENSOR, shape=shape, dtype="<f4", external=[(secret, 0, values.nbytes)])


def as_dtype(dtype):
    def edit(f):
        del f[TENSOR]
        f.create_dataset(TENSOR, data=values.astype(dtype))
    return edit


# Also (issue 47 item 15) another element type: it was read as wrong floats or "truncated?".
for tag, edit, why in (("virtual", virtual, "virtual dataset"), ("external_link", external_link, "external link"),
                       ("external_storage", external_storage, "external storage"),
                       ("float64", as_dtype("<f8"), "holds 64-bit floats"), ("float16", as_dtype("<f2"), "holds 16-bit floats"),
                       ("big_endian", as_dtype(">f4"), "32-bit floats in big-endian order")):
    d = os.path.join(a.workdir, tag)
    shutil.copytree(good, d)
    with h5py.File(os.path.join(d, "iter_0000002.h5"), "r+") as f:
        edit(f)
    for ranks, prefix in ((1, []), (2, a.mpi.split())):
        rc, out = run([*prefix, a.gpt, "@" + a.args, *base, "--train-iters", "4", "--load", d])
        errs = [l for l in out.splitlines() if "error:" in l]
        check(rc not in (0, "timeout") and errs and TENSOR in errs[0] and why in errs[0],
              f"{tag}: --load on {ranks} rank(s) refused with one line naming {TENSOR} and '{why}' (exit {rc}): "
              f"{errs[:1] or out[-400:]}")
    rc, out = run([a.tool, "verify", d])
    check(rc == 1 and why in out, f"{tag}: hpct_ckpt verify exits 1 naming '{why}' (exit {rc}): {out[-300:]}")
    exported = os.path.join(a.workdir, tag + "_export")
    os.makedirs(exported)
    rc, out = run([a.tool, "export", d, os.path.join(exported, "model.safetensors")])
    leaked = False
    for root, _, files in os.walk(exported):
        for n in files:
            leaked = leaked or b"TOPSECRET" in open(os.path.join(root, n), "rb").read()
    check(rc not in (0, "timeout") and why in out and not leaked,
          f"{tag}: hpct_ckpt export refused naming '{why}', nothing of the secret written (exit {rc}): {out[-300:]}")
    rc, out = run([a.generate, "--load", d, "--prompt", "hello", "--max-new-tokens", "2"])
    check(rc not in (0, "timeout") and why in out, f"{tag}: generate refused naming '{why}' (exit {rc}): {out[-300:]}")

# Chunked and compact storage are this file's own data: --load and verify agree in taking them
# (issue 47 item 11: they loaded but failed verify).
def restored(layout):
    def edit(f):
        attrs = dict(f[TENSOR].attrs)
        del f[TENSOR]
        if layout == "chunked":
            f.create_dataset(TENSOR, data=values, chunks=(max(1, values.shape[0] // 4),) + values.shape[1:])
        else:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            space = h5py.h5s.create_simple(values.shape)
            dsid = h5py.h5d.create(f.id, TENSOR.encode(), h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)
            dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, values.astype("<f4"))
        for k, v in attrs.items():
            f[TENSOR].attrs[k] = v
    return edit


for layout in ("chunked", "compact"):
    d = os.path.join(a.workdir, layout)
    shutil.copytree(good, d)
    with h5py.File(os.path.join(d, "iter_0000002.h5"), "r+") as f:
        restored(layout)(f)
    rc_v, out_v = run([a.tool, "verify", d])
    rc_l, out_l = run([a.gpt, "@" + a.args, *base, "--train-iters", "3", "--load", d])
    check(rc_v == 0 and rc_l == 0, f"{layout}: verify (exit {rc_v}) and --load (exit {rc_l}) both take it: "
                                   f"{(out_v if rc_v else out_l)[-300:] if rc_v or rc_l else ''}")

rc, out = run([a.gpt, "@" + a.args, *base, "--train-iters", "4", "--load", good])
check(rc == 0, f"the good checkpoint still loads (exit {rc}): {out[-300:] if rc else ''}")
c.finish()
