"""What every end-to-end check script of the suite shares: its required arguments, a fresh work
directory, `check` lines ("ok   ..." / "FAIL ...") and the closing "N failed" with the exit code.

    from checklib import Checks
    c = Checks("--gpt", "--workdir")      # parses these (required) flags; a is c.args
    c.check(cond, "what must hold")
    c.finish()
"""
import argparse
import os
import shutil
import sys


class Checks:
    def __init__(self, *required, workdir="--workdir"):
        ap = argparse.ArgumentParser()
        for k in required:
            ap.add_argument(k, required=True)
        self.args = ap.parse_args()
        self.fails = []
        d = getattr(self.args, workdir.lstrip("-").replace("-", "_"), None)
        if d:
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)

    def check(self, cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            self.fails.append(msg)
        return cond

    def finish(self):
        print(f"{len(self.fails)} failed")
        sys.exit(1 if self.fails else 0)
