"""What every end-to-end check script of the suite shares: its required arguments, a fresh work
directory (removed again when every check passed), `check` lines ("ok   ..." / "FAIL ...") and the
closing "N failed" with the exit code.

    from checklib import Checks
    c = Checks("--gpt", "--workdir")      # parses these (required) flags; a is c.args
    c.check(cond, "what must hold")
    c.one_line_error("bad flag", subprocess.run(...), "generate", ["--top-p"])
    c.finish()
"""
import argparse
import os
import shutil
import subprocess
import sys
import time


def system_python_for(*modules):
    """Re-runs this script under Debian's /usr/bin/python3 when `modules` (h5py, numpy: Debian's
    python3-h5py, scripts/install_deps.sh) do not import in the interpreter that started it."""
    try:
        for m in modules:
            __import__(m)
    except ImportError:
        if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
        raise


class Checks:
    def __init__(self, *required, workdir="--workdir"):
        ap = argparse.ArgumentParser()
        for k in required:
            ap.add_argument(k, required=True)
        self.args = ap.parse_args()
        self.fails = []
        d = getattr(self.args, workdir.lstrip("-").replace("-", "_"), None)
        self.workdir = d
        if d:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)

    def check(self, cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            self.fails.append(msg)
        return cond

    def run(self, cmd, want=0, timeout=600):
        """Runs cmd; an exit status other than `want` (None: any) is a failure, with its output's tail."""
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if os.environ.get("HPCT_TEST_TIMES") == "1":  # where a check's time goes, command by command
            print(f"[{time.monotonic() - t0:6.1f} s] {os.path.basename(str(cmd[0]))} {' '.join(map(str, cmd[1:8]))}")
        if want is not None and p.returncode != want:
            print(p.stdout[-2000:], p.stderr[-2000:])
            self.check(False, f"exit {p.returncode} (wanted {want}): {' '.join(map(str, cmd[:4]))} ...")
        return p

    def one_line_error(self, name, proc, app, needles):
        """proc failed with exactly one "<app>: error:" line, holding every needle."""
        errs = [l for l in (proc.stdout + proc.stderr).splitlines() if "error" in l]
        ok = proc.returncode != 0 and len(errs) == 1 and errs[0].startswith(app + ": error:") and \
            all(n in errs[0] for n in needles)
        return self.check(ok, f"{name}: one line naming {', '.join(needles)} (exit {proc.returncode}: "
                              f"{errs[0] if len(errs) == 1 else errs})")

    def finish(self):
        """The verdict. A passing check removes its work directory (checkpoints of hundreds of MB
        each would otherwise fill a CI machine's disk over the suite); a failing one keeps it to be
        read, as does HPCT_KEEP_TEST_OUTPUT=1."""
        print(f"{len(self.fails)} failed")
        if not self.fails and self.workdir and os.environ.get("HPCT_KEEP_TEST_OUTPUT") != "1":
            shutil.rmtree(self.workdir, ignore_errors=True)
        sys.exit(1 if self.fails else 0)

    def train_tiny_brown(self, gpt, data, save, iters, batch, lr):
        """A 2-layer, hidden-64 GPT trained `iters` steps on Brown with GPT-2's tokenizer (data: the
        directory with brown_text_document, gpt2-vocab.json, gpt2-merges.txt), saved to `save`: the
        model the generate tests decode with."""
        return self.run([gpt, "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
                         "--micro-batch-size", str(batch), "--global-batch-size", str(batch), "--lr", lr,
                         "--train-iters", str(iters), "--eval-iters", "0",
                         "--data-path", os.path.join(data, "brown_text_document"),
                         "--vocab-file", os.path.join(data, "gpt2-vocab.json"),
                         "--merge-file", os.path.join(data, "gpt2-merges.txt"), "--save", save])


REVERSE_WORDS = ("apple river stone house green music paper window garden yellow summer winter table doctor school "
                 "water light market silver forest").split()


def write_reverse_task(path, n=400, seed=3):
    """The finetuning tests' instruction task: n JSON lines "Reverse: w1 w2 =>" -> " w2 w1" (2 to 4
    of 20 words, drawn with `seed`), with an extra field the loader must ignore."""
    import json
    import random
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            w = rng.sample(REVERSE_WORDS, rng.randint(2, 4))
            f.write(json.dumps({"prompt": "Reverse: " + " ".join(w) + " =>", "response": " " + " ".join(reversed(w)),
                                "id": "ignored"}) + "\n")
