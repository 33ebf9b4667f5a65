#!/usr/bin/env python3
"""The tokenizer files a checkpoint's config names are checked before use (issue 47, High items 3, 4).

ckpt_tokenizer_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --generate GENERATE --args ARGS --data DIR --workdir DIR

A run on real tokens saves a checkpoint whose config names its vocab and merges files and whose
`tokenizer` attribute holds their FNV-1a fingerprints. The config is then forged with h5py and the
run-state checksum recomputed (FNV-1a is public, so the checksum guards against damage, not against
an author), with `vocab_file` naming
  - a "secret" local file: `hpct_ckpt export` must not copy it as vocab.json (it did: an export is
    meant to be published), and must say which file differs; `generate` refuses it;
  - /dev/zero and a FIFO: `generate` and `export` must end within 30 s (generate hashed /dev/zero
    forever; a FIFO blocked in open) with a line that says what the path is.
The good checkpoint exports both files byte for byte, and an export over a symbolic link planted at
OUT/vocab.json is refused without --force and with it replaces the link instead of writing through it.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py")
import h5py  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_forge import rechecksum, run_state_checksum  # noqa: E402  (tests/engine/ckpt_forge.py)

c = Checks("--gpt", "--tool", "--generate", "--args", "--data", "--workdir")
a, check = c.args, c.check
vocab, merges = os.path.join(a.data, "gpt2-vocab.json"), os.path.join(a.data, "gpt2-merges.txt")
if not (os.path.exists(vocab) and os.path.exists(os.path.join(a.data, "brown_text_document.bin"))):
    print(f"SKIPPED: no GPT-2 tokenizer or Brown data in {a.data} (scripts/fetch_data.sh)")
    sys.exit(77)


def run(cmd, timeout=30):
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired:
        return "timeout", ""


good = os.path.join(a.workdir, "good")
rc, out = run([a.gpt, "@" + a.args, "--data-path", os.path.join(a.data, "brown_text_document"), "--vocab-file", vocab,
               "--merge-file", merges, "--micro-batch-size", "2", "--global-batch-size", "2", "--num-layers", "1",
               "--train-iters", "1", "--eval-iters", "0", "--lr-decay-iters", "10", "--save", good], timeout=300)
check(rc == 0, f"a good checkpoint on GPT-2 tokens is saved (exit {rc}): {out[-300:] if rc else ''}")
ckpt = "iter_0000001.h5"
with h5py.File(os.path.join(good, ckpt), "r") as f:
    check(int(f.attrs["run_state_checksum"]) == run_state_checksum(f),
          "the test's run-state checksum is the checkpointer's (so the forgeries below pass it)")
    config = f.attrs["config"]
    config = config.decode() if isinstance(config, bytes) else str(config)
check(config.count('"' + vocab + '"') == 1, f"the stored config names {vocab} once")

secret = os.path.join(a.workdir, "secret.json")
with open(secret, "w") as s:
    s.write('{"TOPSECRET": 0}\n')
fifo = os.path.join(a.workdir, "vocab.fifo")
os.mkfifo(fifo)


def forged(tag, path):
    d = os.path.join(a.workdir, tag)
    shutil.copytree(good, d)
    with h5py.File(os.path.join(d, ckpt), "r+") as f:
        f.attrs["config"] = config.replace('"' + vocab + '"', '"' + path + '"')
        rechecksum(f)
    return d


def exported_files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)}


# The good checkpoint: both files exported byte for byte; a link planted at OUT/vocab.json is replaced.
out_dir = os.path.join(a.workdir, "export_good")
os.makedirs(out_dir)
victim = os.path.join(a.workdir, "victim.txt")
with open(victim, "w") as v:
    v.write("untouched\n")
os.symlink(victim, os.path.join(out_dir, "vocab.json"))
rc, out = run([a.tool, "export", good, os.path.join(out_dir, "model.safetensors")])
check(rc != 0 and "vocab.json" in out and "--force" in out and open(victim).read() == "untouched\n",
      f"without --force the export refuses to replace the planted link (exit {rc})")
rc, out = run([a.tool, "export", good, os.path.join(out_dir, "model.safetensors"), "--force"])
files = exported_files(out_dir)
check(rc == 0 and files.get("vocab.json") == open(vocab, "rb").read() and files.get("merges.txt") == open(merges, "rb").read(),
      f"the good checkpoint exports the run's vocab and merges byte for byte (exit {rc}): {out[-300:] if rc else ''}")
check(not os.path.islink(os.path.join(out_dir, "vocab.json")) and open(victim).read() == "untouched\n",
      "a symbolic link planted at OUT/vocab.json is replaced, its target untouched")
rc, out = run([a.generate, "--load", good, "--prompt", "The", "--max-new-tokens", "2"], timeout=120)
check(rc == 0, f"generate takes the good checkpoint's tokenizer (exit {rc}): {out[-300:] if rc else ''}")

for tag, path, why in (("secret", secret, "is not the vocab file the checkpoint was trained with"),
                       ("dev_zero", "/dev/zero", "is a character device, not a regular file"),
                       ("fifo", fifo, "is a FIFO, not a regular file")):
    d = forged(tag, path)
    rc, out = run([a.tool, "verify", d])
    check(rc == 0, f"{tag}: the forged run state passes verify (a recomputed checksum) (exit {rc})")
    out_dir = os.path.join(a.workdir, tag + "_export")
    os.makedirs(out_dir)
    rc, out = run([a.tool, "export", d, os.path.join(out_dir, "model.safetensors")])
    files = exported_files(out_dir)
    line = next((l for l in out.splitlines() if "vocab.json not copied" in l), "")
    check(rc == 0 and "vocab.json" not in files and path in line and why in line and "merges.txt" in files and
          not any(b"TOPSECRET" in v for v in files.values()),
          f"{tag}: export writes the weights and merges.txt, not vocab.json, saying '{path} ... {why}' (exit {rc}): "
          f"{line or out[-300:]}")
    rc, out = run([a.generate, "--load", d, "--prompt", "The", "--max-new-tokens", "2"])
    errs = [l for l in out.splitlines() if "error:" in l]
    check(rc not in (0, "timeout") and len(errs) == 1 and path in errs[0] and why in errs[0],
          f"{tag}: generate refuses in time with one line naming {path} and '{why}' (exit {rc}): {errs or out[-300:]}")
c.finish()
