#!/usr/bin/env python3
"""h5py_read_check.py FILE VERIFY_JSON: h5py reads an hpctrain checkpoint as users would.

Every tensor `hpct_ckpt verify --json` lists is a float32 dataset of the listed shape, and its
values, read by h5py, give back the checksum hpctrain stored (the formula of
Checkpointer::checksum_at, recomputed with numpy). The root's iteration attribute is read too.
"""
import json
import sys

import h5py
import numpy as np

f, vj = sys.argv[1], json.load(open(sys.argv[2]))
errors = []


def splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


with np.errstate(over="ignore"), h5py.File(f, "r") as h:
    if int(h.attrs["iteration"]) != vj["iteration"]:
        errors.append(f"iteration attribute {h.attrs['iteration']}, hpct_ckpt says {vj['iteration']}")
    for t in vj["tensors"]:
        ds = h[t["name"]]
        a = ds[...]
        if list(a.shape) != t["shape"] or a.dtype != np.float32:
            errors.append(f"{t['name']} is {a.dtype}{list(a.shape)}, expected float32{t['shape']}")
            continue
        bits = a.reshape(-1).view(np.uint32).astype(np.uint64)
        idx = np.arange(bits.size, dtype=np.uint64)
        mine = int(splitmix64((idx * np.uint64(0x100000001B3)) ^ bits).sum(dtype=np.uint64))
        if mine != int(t["stored_checksum"]) or int(ds.attrs["checksum"]) != mine:
            errors.append(f"{t['name']}: values read by h5py give checksum {mine}, stored {t['stored_checksum']}")
for e in errors:
    print("FAIL:", e)
if not errors:
    print(f"h5py {h5py.version.version} (HDF5 {h5py.version.hdf5_version}) read all {len(vj['tensors'])} tensors; "
          "their checksums match")
sys.exit(1 if errors else 0)
