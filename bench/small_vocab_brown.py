#!/usr/bin/env python3
"""Re-tokenize the Brown dataset with a small vocabulary, for benchmarks of layer-dominated models.

gpt-tiny's GPT-2 vocabulary (50,257 tokens) puts most of a small model's FLOPs in the LM head. This
keeps the 256 byte tokens, the K most frequent multi-byte GPT-2 tokens of the corpus and
<|endoftext|>; every other GPT-2 token is spelled out in its bytes. Nothing of the text is lost:
the small vocabulary (written as vocab.json with an empty merges file) decodes every sample.

  bench/small_vocab_brown.py [--size 1024] [--data data/brown_text_document]
                             [--vocab data/gpt2-vocab.json] [--out data/brown_v1024]

Writes OUT_text_document.{bin,idx} (Megatron MMIDIDX, uint16), OUT-vocab.json, OUT-merges.txt.
Standard library only.
"""
import argparse
import array
import json
import struct
import sys
from collections import Counter

MAGIC = b"MMIDIDX\x00\x00"
UINT16 = 8  # Megatron's dtype code


def byte_decoder():
    """GPT-2's byte-level alphabet: the printable code point that stands for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def read_indexed(prefix):
    idx = open(prefix + ".idx", "rb").read()
    if idx[:9] != MAGIC or struct.unpack("<Q", idx[9:17])[0] != 1 or idx[17] != UINT16:
        sys.exit(f"{prefix}.idx: expected a version-1 MMIDIDX index of uint16 tokens")
    n, d = struct.unpack("<QQ", idx[18:34])
    off = 34
    sizes = array.array("i", idx[off:off + 4 * n]); off += 4 * n
    pointers = array.array("q", idx[off:off + 8 * n]); off += 8 * n
    doc_idx = array.array("q", idx[off:off + 8 * d])
    tokens = array.array("H", open(prefix + ".bin", "rb").read())
    seqs = [tokens[p // 2:p // 2 + s] for p, s in zip(pointers, sizes)]
    return seqs, doc_idx


def write_indexed(prefix, seqs, doc_idx):
    sizes = array.array("i", (len(s) for s in seqs))
    pointers, at = array.array("q"), 0
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            pointers.append(at)
            f.write(s.tobytes())
            at += 2 * len(s)
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<Q", 1) + bytes([UINT16]) + struct.pack("<QQ", len(seqs), len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=1024, help="vocabulary size, bytes and <|endoftext|> included")
    ap.add_argument("--data", default="data/brown_text_document")
    ap.add_argument("--vocab", default="data/gpt2-vocab.json")
    ap.add_argument("--out", default="data/brown_v1024")
    a = ap.parse_args()
    if a.size < 258 or a.size >= 65500:
        sys.exit(f"--size {a.size}: give 258 (bytes and <|endoftext|> and one more) to 65499")
    gpt2 = json.load(open(a.vocab, encoding="utf-8"))
    dec = byte_decoder()
    spelled = {i: bytes(dec[c] for c in tok) for tok, i in gpt2.items() if tok != "<|endoftext|>"}
    eod_gpt2 = gpt2["<|endoftext|>"]
    seqs, doc_idx = read_indexed(a.data)
    counts = Counter(t for s in seqs for t in s)
    multi = [t for t, _ in counts.most_common() if t != eod_gpt2 and len(spelled[t]) > 1][:a.size - 257]
    # new ids: bytes 0-255, the kept tokens by frequency, then <|endoftext|>
    inv = {b: c for c, b in dec.items()}
    vocab = {inv[b]: b for b in range(256)}
    new_id = {}
    for t in multi:
        new_id[t] = len(vocab)
        vocab["".join(inv[b] for b in spelled[t])] = new_id[t]
    new_id[eod_gpt2] = vocab["<|endoftext|>"] = len(vocab)
    out = []
    for s in seqs:
        r = array.array("H")
        for t in s:
            if t in new_id:
                r.append(new_id[t])
            else:
                r.extend(spelled[t])
        out.append(r)
    write_indexed(a.out + "_text_document", out, doc_idx)
    json.dump(vocab, open(a.out + "-vocab.json", "w", encoding="utf-8"), ensure_ascii=False)
    open(a.out + "-merges.txt", "w").write("#version: 0.2\n")
    n_in, n_out = sum(map(len, seqs)), sum(map(len, out))
    print(f"{a.out}_text_document: {len(out)} documents, {n_out:,} tokens of a {len(vocab)}-token vocabulary "
          f"(GPT-2: {n_in:,}, {n_out / n_in:.2f}x)")


if __name__ == "__main__":
    try:
        main()
    except OSError as e:  # a missing input: one line naming it (scripts/fetch_data.sh fetches them)
        sys.exit(f"{e.filename}: {e.strerror} (run scripts/fetch_data.sh for Brown and the GPT-2 vocab)")
