#!/usr/bin/env python3
"""hpct_ckpt export/import: a trained GPT checkpoint exported to safetensors has GPT-2's tensor names
and layouts (linear weights (in, out), vocabulary padding dropped) in a well-formed file (8-byte
little-endian header length, JSON header, contiguous data offsets covering the rest of the file);
importing it gives a checkpoint whose model tensors carry the same checksums as the original
(every value, through both transposes), exporting that again gives the same bytes, and
pretrain_gpt --load continues from it. And GPT-2's forward as Hugging Face defines it, written in
numpy (gpt2_numpy_loss.py), computes pretrain_gpt's loss from the exported weights.

safetensors_check.py --gpt BIN --tool HPCT_CKPT --args FILE --workdir DIR
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--tool", "--args", "--workdir")
a, check, fails = c.args, c.check, c.fails


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"failed: {' '.join(cmd)}")
    return p.stdout


d1, d2 = os.path.join(a.workdir, "trained"), os.path.join(a.workdir, "imported")
st1, st2 = os.path.join(a.workdir, "gpt.safetensors"), os.path.join(a.workdir, "again.safetensors")
common = ["@" + a.args, "--mock-data", "--vocab-size", "500", "--eval-iters", "0", "--log-interval", "1",
          "--lr-decay-iters", "100"]  # one schedule for every run length (resumes may not change it)
run([a.gpt, *common, "--train-iters", "3", "--save", d1])
run([a.tool, "export", d1, st1])

with open(st1, "rb") as f:
    raw = f.read()
(hl,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + hl])
check((8 + hl) % 8 == 0, "data starts 8-byte aligned")
meta = header.pop("__metadata__", {})
check(meta.get("format") == "pt", "metadata format pt")
spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
check(spans[0][0] == 0 and all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)),
      "data offsets are contiguous from 0")
check(spans[-1][1] == len(raw) - 8 - hl, "data offsets cover the rest of the file")
L, C, T = 4, 128, 128  # inputs/gpt-tiny.args
want = {"wte.weight": [500, C], "wpe.weight": [T, C], "ln_f.weight": [C], "ln_f.bias": [C]}
for l in range(L):
    h = f"h.{l}."
    want.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C], h + "attn.c_attn.weight": [C, 3 * C],
                 h + "attn.c_attn.bias": [3 * C], h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                 h + "ln_2.weight": [C], h + "ln_2.bias": [C], h + "mlp.c_fc.weight": [C, 4 * C],
                 h + "mlp.c_fc.bias": [4 * C], h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
check(set(header) == set(want), f"GPT-2 tensor names ({len(header)} tensors)")
check(all(header[k]["shape"] == v and header[k]["dtype"] == "F32" for k, v in want.items() if k in header),
      "GPT-2 shapes: (in, out) linear weights, 500 vocabulary rows (padding dropped), F32")
ln = header["h.0.ln_1.weight"]["data_offsets"]
vals = struct.unpack(f"<{C}f", raw[8 + hl + ln[0]:8 + hl + ln[1]])
check(all(v == v for v in vals) and any(v != 1.0 for v in vals), "values are the trained ones (ln_1 moved from 1)")

run([a.tool, "import", st1, d2, "--num-attention-heads", "4"])
# Again into the same directory (now holding a checkpoint): refused, the file kept (issue 47 item 9).
before = open(os.path.join(d2, "iter_0000000.h5"), "rb").read()
p = subprocess.run([a.tool, "import", st1, d2, "--num-attention-heads", "4"], capture_output=True, text=True)
check(p.returncode != 0 and "already holds checkpoints (iter_0000000.h5)" in p.stderr and
      open(os.path.join(d2, "iter_0000000.h5"), "rb").read() == before,
      f"import into a directory holding checkpoints is refused, its checkpoint untouched (exit {p.returncode}): {p.stderr[-300:]}")


def listing(cmd, path):
    out = os.path.join(a.workdir, cmd + ".json")
    run([a.tool, cmd, path, "--json", out])
    return json.load(open(out))


j1, j2 = listing("list", d1), listing("verify", d2)
check(j2["result"] == "OK", "the imported checkpoint verifies")
s1 = {t["name"]: t for t in j1["tensors"]}
s2 = {t["name"]: t for t in j2["tensors"]}
model = [n for n in s1 if n.startswith("/model/") and "word_embeddings" not in n]
check(len(model) == len(want) - 1 and all(s1[n]["shape"] == s2[n]["shape"] for n in model),
      f"{len(model)} model tensors with the same shapes after import")


# The stored checksum of every model tensor is a function of its values only: equal checksums
# between the two files mean equal values (word embeddings aside: their padding rows are new zeros).
check(all(s1[n]["stored_checksum"] == s2[n]["stored_checksum"] for n in model),
      "every model tensor's stored checksum is the same after export + import (values exact)")

# A second export beside the first would replace its config.json: refused in one line naming the
# file and --force, nothing written; with --force it goes ahead.
p = subprocess.run([a.tool, "export", d2, st2], capture_output=True, text=True)
errs = [ln for ln in (p.stdout + p.stderr).splitlines() if "error" in ln]
check(p.returncode != 0 and len(errs) == 1 and "config.json" in errs[0] and "--force" in errs[0] and not os.path.exists(st2),
      f"export over an existing config.json is refused naming it and --force ({errs})")
run([a.tool, "export", d2, st2, "--force"])
check(open(st1, "rb").read()[8 + hl:] == open(st2, "rb").read()[-(len(raw) - 8 - hl):],
      "exporting the imported checkpoint gives the same tensor bytes")

out = run([a.gpt, *common, "--train-iters", "2", "--load", d2])
check("loading checkpoint from" in out and "iteration        2/" in out, "pretrain_gpt --load continues from the import")

# Hostile files (issue 17, item 1): each edit of the exported header is refused with exit 1 and one
# line naming the file (before: a heap overflow, SIGSEGV/SIGABRT, or a wrong model imported with
# exit 0); nothing is written to the target directory.
def hostile(name, edit, want, data=None):
    hd = json.loads(raw[8:8 + hl])
    edit(hd)
    text = json.dumps(hd).encode()
    path = os.path.join(a.workdir, f"hostile_{name}.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + (raw[8 + hl:] if data is None else data))
    target = os.path.join(a.workdir, f"hostile_{name}")
    p = subprocess.run([a.tool, "import", path, target], capture_output=True, text=True)
    err = p.stderr.strip()
    check(p.returncode == 1 and err.count("\n") == 0 and "hpct_ckpt: error:" in err and path in err and want in err,
          f"hostile safetensors '{name}' refused in one line naming the file ({p.returncode}: {err[:300]})")
    check(not os.path.exists(os.path.join(target, "latest")), f"hostile safetensors '{name}' wrote no checkpoint")


def setk(k, field, v):
    return lambda hd: hd[k].__setitem__(field, v)


b0 = header["ln_f.bias"]["data_offsets"][0]
hostile("offsets_longer", setk("ln_f.bias", "data_offsets", [b0, b0 + 400000]), "spans 400000 bytes")
hostile("overlap", setk("ln_f.bias", "data_offsets", [0, C * 4]), "overlap")
hostile("negative", setk("ln_f.bias", "data_offsets", [-4, C * 4 - 4]), "non-negative")
hostile("reversed", setk("ln_f.bias", "data_offsets", [b0 + C * 4, b0]), "end before they begin")
hostile("past_end", setk("ln_f.bias", "data_offsets", [len(raw), len(raw) + C * 4]), "gap")
hostile("overflow", setk("ln_f.bias", "shape", [2**32, 2**32]), "overflows")
hostile("no_dtype", lambda hd: hd["ln_f.bias"].pop("dtype"), "no dtype")
hostile("one_offset", setk("ln_f.bias", "data_offsets", [b0]), "data_offsets [begin, end]")
hostile("wte_shape", setk("wte.weight", "shape", [250, 2 * C]), "hidden size is 256")
hostile("wte_1d", setk("wte.weight", "shape", [500 * C]), "GPT-2's is 2-D")
hostile("bias_shape", setk("h.1.ln_2.bias", "shape", [C // 2, 2]), "this model needs [128]")
hostile("truncated", lambda hd: None, "truncated", data=raw[8 + hl:-16])

# A header that names only a few tensors of a huge model (hidden 65536: 200 GB of parameters) is
# refused before anything is allocated (was std::bad_alloc through std::terminate).
def write_st(path, tensors):
    hd, off, data = {}, 0, b""
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        hd[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
        off += 4 * n
        data += bytes(4 * n)
    text = json.dumps(hd).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


huge = os.path.join(a.workdir, "huge.safetensors")
write_st(huge, [("wte.weight", [1, 65536]), ("wpe.weight", [1, 65536]), ("h.0.ln_1.weight", [65536])])
p = subprocess.run([a.tool, "import", huge, os.path.join(a.workdir, "huge")], capture_output=True, text=True)
check(p.returncode == 1 and "has no tensor 'h.0." in p.stderr,
      f"a header naming a few tensors of a huge model is refused before allocating ({p.returncode}: {p.stderr.strip()[:200]})")
p = subprocess.run([a.tool, "import", st1, os.path.join(a.workdir, "x"), "--num-attention-heads", "x"], capture_output=True, text=True)
check(p.returncode == 2 and "--num-attention-heads expects an integer" in p.stderr,
      f"a bad --num-attention-heads is one line, exit 2 ({p.returncode}: {p.stderr.strip()[:200]})")

# What the export means, read independently: GPT-2's forward as Hugging Face defines it, in numpy
# (gpt2_numpy_loss.py), on the exported weights, gives the loss pretrain_gpt logs with the same
# weights on the same sample. One step is saved; the run resumed from it logs iteration 2's loss,
# computed with those weights on mock sample 1 (global batch 1). Vocabulary 512 has no padding
# rows (with padding, GPT-2's softmax would lack the padding logits hpctrain has). Dropout off: the
# training loss is then the plain forward's.
d3, st3, m3 = (os.path.join(a.workdir, x) for x in ("fwd", "fwd.safetensors", "fwd.jsonl"))
fwd = ["@" + a.args, "--mock-data", "--vocab-size", "512", "--seq-length", "32", "--micro-batch-size", "1",
       "--global-batch-size", "1", "--eval-iters", "0", "--log-interval", "1", "--lr-decay-iters", "100",
       "--attention-dropout", "0", "--hidden-dropout", "0"]
run([a.gpt, *fwd, "--train-iters", "1", "--save", d3])
run([a.gpt, *fwd, "--train-iters", "2", "--load", d3, "--metrics-file", m3])
run([a.tool, "export", d3, st3, "--force"])
ours = [r["lm_loss"] for r in map(json.loads, open(m3)) if r.get("type") == "train" and r.get("iteration") == 2]
here = os.path.dirname(os.path.abspath(__file__))
ref = None
for py in [sys.executable, "/usr/bin/python3"]:  # numpy comes with Debian's python3-h5py (install_deps.sh)
    if subprocess.run([py, "-c", "import numpy"], capture_output=True).returncode == 0:
        ref = float(run([py, os.path.join(here, "gpt2_numpy_loss.py"), st3, "4", "1234", "512", "32", "1"]))
        break
check(ref is not None, "numpy is available for the reference forward (scripts/install_deps.sh)")
if ref is not None and ours:
    print(f"loss with the checkpoint's weights on sample 1: pretrain_gpt {ours[0]:.9f}, GPT-2 in numpy {ref:.9f}")
    check(abs(ours[0] - ref) <= 1e-5 * abs(ref), "GPT-2's forward (numpy, float64) on the export gives pretrain_gpt's loss (1e-5)")
else:
    check(False, "pretrain_gpt logged iteration 2's loss")
c.finish()
