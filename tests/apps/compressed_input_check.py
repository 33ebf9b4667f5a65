#!/usr/bin/env python3
"""preprocess_data reads corpora as they ship: compressed, in several files, or refuses them.

The Pile and RedPajama ship .jsonl.zst; others .gz or .bz2. Read as plain text, their compressed
bytes used to become a garbage dataset with exit 0. Here, from one JSONL corpus (and one text
corpus):
- gzip (two concatenated members, as `cat a.gz b.gz` makes), zstd (two frames) and bzip2 give the
  same .bin/.idx bytes as the plain file, and the start line names the compression;
- the corpus split into three shards, plain, .gz and .zst, given as a list and as a glob, gives the
  same dataset as the whole file;
- an .xz file, a binary file, a truncated .zst and a glob that matches nothing are refused in one
  line naming the file (or --input), and no dataset is left behind.

compressed_input_check.py --preprocess PREPROCESS_DATA --data DATA_DIR --workdir DIR
"""
import bz2
import gzip
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from checklib import Checks  # noqa: E402

c = Checks("--preprocess", "--data", "--workdir")
a = c.args
w = a.workdir
tok = ["--vocab-file", os.path.join(a.data, "gpt2-vocab.json"), "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]
docs = [{"text": f"Document {i}: caf\u00e9 na\u00efve \u2014 {'words ' * (i % 17)}end. \u65e5\u672c {i * i}"} for i in range(300)]
lines = [json.dumps(d, ensure_ascii=False) + "\n" for d in docs]
plain = os.path.join(w, "corpus.jsonl")
with open(plain, "w", encoding="utf-8") as f:
    f.writelines(lines)
raw = "".join(lines).encode()
half = len(raw) // 2 + 7  # any byte boundary: members and frames need not end on a line
with open(plain + ".gz", "wb") as f:  # two members
    f.write(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
with open(plain + ".bz2", "wb") as f:
    f.write(bz2.compress(raw))
with open(os.path.join(w, "p1"), "wb") as f:
    f.write(raw[:half])
with open(os.path.join(w, "p2"), "wb") as f:
    f.write(raw[half:])
zst = plain + ".zst"
with open(zst, "wb") as f:  # two frames
    for part in ("p1", "p2"):
        f.write(subprocess.run(["zstd", "-q", "-c", os.path.join(w, part)], capture_output=True, check=True).stdout)


def preprocess(inputs, prefix, *extra, want=0):
    return c.run([a.preprocess, "--input", *inputs, "--output-prefix", os.path.join(w, prefix), *tok, "--append-eod",
                  *extra], want=want)


def dataset(prefix, key="text"):
    base = os.path.join(w, f"{prefix}_{key}_document")
    if not os.path.exists(base + ".bin"):
        return None
    return open(base + ".bin", "rb").read(), open(base + ".idx", "rb").read()


preprocess([plain], "plain")
want = dataset("plain")
c.check(want is not None and len(want[0]) > 1000, "the plain corpus gives a dataset")
for name, path, kind in (("gzip", plain + ".gz", "gzip"), ("zstd", zst, "zstd"), ("bzip2", plain + ".bz2", "bzip2")):
    p = preprocess([path], name)
    c.check(f"compression {kind}" in p.stdout, f"{name}: the start line names the compression")
    c.check(dataset(name) == want, f"{name}: the same .bin/.idx bytes as the plain file")

# Shards: plain, gzip, zstd, in order; as a list and as a glob.
shards = [raw[: len(raw) // 3], raw[len(raw) // 3: 2 * len(raw) // 3], raw[2 * len(raw) // 3:]]
cut = [s.rfind(b"\n") + 1 for s in shards[:2]]  # shards end on a line (a document never spans files)
shards = [raw[: cut[0]], raw[cut[0]: len(raw) // 3 + cut[1]], raw[len(raw) // 3 + cut[1]:]]
os.makedirs(os.path.join(w, "shards"))
names = [os.path.join(w, "shards", n) for n in ("part_0.jsonl", "part_1.jsonl.gz", "part_2.jsonl.zst")]
open(names[0], "wb").write(shards[0])
open(names[1], "wb").write(gzip.compress(shards[1]))
open(names[2], "wb").write(subprocess.run(["zstd", "-q", "-c"], input=shards[2], capture_output=True, check=True).stdout)
p = preprocess(names, "list")
c.check(dataset("list") == want, "three shards (plain, gzip, zstd) as a list: the whole corpus's dataset")
c.check("3 files" in p.stdout and "compression none, gzip, zstd" in p.stdout, "the start line counts the files")
preprocess([os.path.join(w, "shards", "part_*")], "glob")
c.check(dataset("glob") == want, "the same shards as a glob: the whole corpus's dataset")

# Plain text documents (blank-line separated), gzip-compressed, named .txt.gz.
text = "".join(f"Paragraph {i} with some words.\nIts second line.\n\n" for i in range(50)).encode()
open(os.path.join(w, "book.txt"), "wb").write(text)
open(os.path.join(w, "book.txt.gz"), "wb").write(gzip.compress(text))
preprocess([os.path.join(w, "book.txt")], "book_plain")
preprocess([os.path.join(w, "book.txt.gz")], "book_gz")
c.check(dataset("book_plain") is not None and dataset("book_gz") == dataset("book_plain"),
        "a gzip text corpus (.txt.gz: text, not JSON) equals the plain one")

# Refusals: one line naming the file; nothing written.
xz = plain + ".xz"
open(xz, "wb").write(subprocess.run(["xz", "-c", plain], capture_output=True, check=True).stdout)
binary = os.path.join(w, "weights.jsonl")
open(binary, "wb").write(bytes(range(256)) * 64)
truncated = os.path.join(w, "cut.jsonl.zst")
full = open(zst, "rb").read()
open(truncated, "wb").write(full[: len(full) // 2])
for name, inputs, needles in (("xz", [xz], [xz, "xz"]), ("binary", [binary], [binary, "binary"]),
                              ("truncated zstd", [truncated], [truncated, "truncated"]),
                              ("glob without a match", [os.path.join(w, "nothing_*.jsonl")], ["--input", "matches no file"])):
    prefix = "bad_" + name.replace(" ", "_")
    p = preprocess(inputs, prefix, want=None)
    c.one_line_error(name, p, "preprocess_data", needles)
    c.check(dataset(prefix) is None, f"{name}: no dataset written (the builder renames its files into place at the end)")
c.finish()
