"""What a checkpoint's author can recompute: the run-state checksum (FNV-1a 64, public) over the
stored attributes' text, as lib/engine/src/checkpoint/checkpoint_state.cpp's checksum_of writes it. The
hostile-checkpoint checks forge edits that pass it, so that the check behind it is what refuses.

    from ckpt_forge import run_state_checksum, rechecksum
    with h5py.File(path, "r+") as f:
        f.attrs["config"] = ...
        rechecksum(f)
"""
import numpy as np


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def _text(f, k):
    v = f.attrs[k]
    return v.decode() if isinstance(v, bytes) else str(v)


def run_state_checksum(f):
    t = (f"{_text(f, 'format')}\niteration={int(f.attrs['iteration'])}\nconsumed_samples={int(f.attrs['consumed_samples'])}"
         f"\noptimizer_step={int(f.attrs['optimizer_step'])}\nskipped_iterations={int(f.attrs['skipped_iterations'])}"
         f"\nnan_iterations={int(f.attrs['nan_iterations'])}\nseed={int(f.attrs['seed'])}\nloss_scaler={_text(f, 'loss_scaler')}"
         f"\nconfig={_text(f, 'config')}\narchitecture={_text(f, 'architecture')}\ntokenizer={_text(f, 'tokenizer')}"
         f"\nparallel_layout={_text(f, 'parallel_layout')}")
    for k in ("consumed_tokens", "consumed_layer_tokens"):
        if k in f.attrs:
            t += f"\n{k}={int(f.attrs[k])}"
    if int(f.attrs.get("optimizer_step_base", 0)) != 0:
        t += f"\noptimizer_step_base={int(f.attrs['optimizer_step_base'])}"
    return fnv1a(t.encode())


def rechecksum(f):
    """Stores the checksum of the attributes as they are now (an edit that passes the guard)."""
    f.attrs["run_state_checksum"] = np.uint64(run_state_checksum(f))


def _splitmix64(x):
    m = 0xFFFFFFFFFFFFFFFF
    x = (x + 0x9e3779b97f4a7c15) & m
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & m
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & m
    return x ^ (x >> 31)


def tensor_checksum(values):
    """Checkpointer::checksum_at over a whole tensor: sum of splitmix64(i * 0x100000001B3 ^ bits_i) mod 2^64."""
    bits = np.ascontiguousarray(values, dtype="<f4").reshape(-1).view("<u4")
    h = 0
    for i, b in enumerate(bits.tolist()):
        h = (h + _splitmix64(((i * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF) ^ b)) & 0xFFFFFFFFFFFFFFFF
    return h


def tensor_set_digest(f):
    """checkpoint_state.cpp's tensor_set_digest over the stored per-tensor checksums."""
    lines = []

    def visit(name, obj):
        if hasattr(obj, "shape") and "checksum" in obj.attrs:
            lines.append(f"/{name} [{', '.join(str(d) for d in obj.shape)}] {int(obj.attrs['checksum'])}\n")
    f.visititems(visit)
    return fnv1a("".join(sorted(lines)).encode())


def set_tensor(f, dataset, values):
    """Writes `values` into the dataset and stores their checksum and the file's tensor_checksums: a
    forged tensor that passes both checks."""
    f[dataset][...] = values
    f[dataset].attrs["checksum"] = np.uint64(tensor_checksum(values))
    f.attrs["tensor_checksums"] = np.uint64(tensor_set_digest(f))
