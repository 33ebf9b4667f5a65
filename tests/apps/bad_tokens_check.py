#!/usr/bin/env python3
"""Token ids a tokenizer could not have produced (issue 17, item 3): a .bin written with another
tokenizer (ids at or past the vocabulary) or corrupted (negative int32 ids). pretrain_gpt must stop
with exit 1 and an error naming the .bin file, the sample and the id — never a SIGSEGV in the
embedding. Also on 2 ranks (the error is one rank's, mid-training: the job is aborted after it is
printed).

bad_tokens_check.py --gpt BIN --args FILE --data-dir DIR --workdir DIR --mpi "MPIEXEC -n 2 ..."
"""
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--args", "--data-dir", "--workdir", "--mpi")
a, check, fails = c.args, c.check, c.fails


def write_mmidx(prefix, docs):
    """Megatron's MMIDIDX with int32 tokens (dtype code 4)."""
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}i", *d))
    sizes = [len(d) for d in docs]
    ptrs, off = [], 0
    for n in sizes:
        ptrs.append(off)
        off += 4 * n
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))
        f.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(docs) + 1))
        f.write(struct.pack(f"<{len(docs)}i", *sizes) + struct.pack(f"<{len(docs)}q", *ptrs))
        f.write(struct.pack(f"<{len(docs) + 1}q", *range(len(docs) + 1)))


for name, bad in [("beyond_vocab", 70000), ("negative", -5)]:
    prefix = os.path.join(a.workdir, name)
    docs = [[(13 * d + t) % 50000 for t in range(200)] for d in range(40)]
    for d in docs:
        d[77] = bad  # every document: whichever sample comes first meets it
    write_mmidx(prefix, docs)
    cmd = [a.gpt, "@" + a.args, "--data-path", prefix, "--vocab-file", os.path.join(a.data_dir, "gpt2-vocab.json"),
           "--merge-file", os.path.join(a.data_dir, "gpt2-merges.txt"), "--train-iters", "2", "--eval-iters", "0",
           "--micro-batch-size", "2", "--global-batch-size", "4", "--seq-length", "64", "--split", "100,0,0"]
    for ranks, launch in [(1, []), (2, a.mpi.split())]:
        p = subprocess.run(launch + cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        errs = [l for l in p.stdout.splitlines() if "pretrain_gpt: error:" in l]
        want = re.compile(rf"token id {bad} at position \d+, outside the vocabulary \[0, 50257\) \(file: {re.escape(prefix)}\.bin\)")
        check(p.returncode not in (0, -11, 139) and "Segmentation fault" not in p.stdout and "signal 11" not in p.stdout,
              f"{name}, {ranks} rank(s): exit {p.returncode}, no segfault")
        check(bool(errs) and all(want.search(l) for l in errs), f"{name}, {ranks} rank(s): the error names the file and id: {errs[:2]}")
        if fails:
            print(p.stdout[-3000:])

c.finish()
