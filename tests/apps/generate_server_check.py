#!/usr/bin/env python3
"""generate's server, interactive mode, stop strings, repetition penalty and beam search:

- generate --server --port 0 on a tiny Brown-trained GPT: four requests sent at once over loopback
  (PUT and POST, Megatron's fields) each answer with the tokens and text the command line gives for
  the same prompts, seed and settings (greedy; sampled with random_seed, two prompts; stop_on_eol
  style stop strings; beam_width 2 with its scores); Megatron's text is the prompt and the
  continuation; add_BOS puts the end-of-document id before the prompt (the command line's
  --prompt-ids with it); a bad request gets 400 and one line naming the field; SIGTERM stops the
  server (exit 0, the requests counted);
- --interactive answers each line of standard input as the command line answers that prompt;
- --stop TEXT: the sample ends at the token that completes TEXT (stop: stop_sequence) and its text
  ends with TEXT; --repetition-penalty changes a greedy text that repeats itself; --beam-width 3:
  three hypotheses, scores best first, each its log-probabilities' mean (length_penalty 1).

generate_server_check.py --gpt PRETRAIN_GPT --generate GENERATE --data DIR --workdir DIR
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks  # noqa: E402  (tests/checklib.py)

c = Checks("--gpt", "--generate", "--data", "--workdir")
a, check = c.args, c.check
w = a.workdir
ck = os.path.join(w, "ckpt")
c.train_tiny_brown(a.gpt, a.data, ck, iters=6, batch=4, lr="3e-3")


def cli(prompts, *flags):
    """The command line's results (ids, text, score) for these prompts, in order."""
    j = os.path.join(w, "cli.json")
    args = [a.generate, "--load", ck, "--json", j, *flags]
    for p in prompts:
        args += ["--prompt", p]
    c.run(args)
    return json.load(open(j))["results"] if os.path.exists(j) else []


# --- the server
srv = subprocess.Popen([a.generate, "--load", ck, "--server", "--port", "0", "--seed", "7", "--micro-batch-size", "4"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
first = srv.stdout.readline()
m = re.search(r"serving on (http://127\.0\.0\.1:\d+/api)", first)
check(m is not None, f"the server says where it listens: {first.strip()}")
url = m.group(1) if m else "http://127.0.0.1:1/api"


def ask(body, method="PUT"):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


requests = {
    "greedy": ({"prompts": ["The jury said"], "tokens_to_generate": 8, "top_k": 1}, "PUT"),
    "sampled": ({"prompts": ["In the city", "It was"], "tokens_to_generate": 6, "temperature": 0.9,
                 "random_seed": 11, "logprobs": True}, "POST"),
    "stop": ({"prompts": ["The jury said"], "tokens_to_generate": 20, "top_k": 1, "stop": [" the"]}, "PUT"),
    "beam": ({"prompts": ["The jury said"], "tokens_to_generate": 5, "beam_width": 2}, "PUT"),
}
answers = {}
threads = [threading.Thread(target=lambda k=k, v=v: answers.__setitem__(k, ask(*v))) for k, v in requests.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
bad = ask({"prompts": "The jury said"})
bos = ask({"prompts": ["The jury said"], "tokens_to_generate": 6, "top_k": 1, "add_BOS": True})

want = {
    "greedy": cli(["The jury said"], "--max-new-tokens", "8", "--top-k", "1", "--seed", "7"),
    "sampled": cli(["In the city", "It was"], "--max-new-tokens", "6", "--temperature", "0.9", "--seed", "11"),
    "stop": cli(["The jury said"], "--max-new-tokens", "20", "--top-k", "1", "--stop", " the", "--seed", "7"),
    "beam": cli(["The jury said"], "--max-new-tokens", "5", "--beam-width", "2"),
}
for k, (body, _) in requests.items():
    status, got = answers.get(k, (None, None))
    ok = status == 200 and isinstance(got, dict)
    check(ok and got["tokens"] == [r["ids"] for r in want[k]],
          f"{k}: the server's tokens are the command line's ({status}: {got if not ok else got['tokens']} vs "
          f"{[r['ids'] for r in want[k]]})")
    if ok:
        check(got["text"] == [p + r["text"] for p, r in zip(body["prompts"] * len(want[k]), want[k])],
              f"{k}: text is the prompt and the continuation ({got['text']})")
        check(all("".join(s) == r["text"] for s, r in zip(got["segments"], want[k])), f"{k}: segments make up the continuation")
        if k == "sampled":
            check(len(got["logprobs"]) == 2 and all(len(lp) == len(r["ids"]) for lp, r in zip(got["logprobs"], want[k])),
                  "logprobs: one per generated token")
        if k == "beam":
            check(len(got["scores"]) == 2 and got["scores"] == sorted(got["scores"], reverse=True) and
                  all(abs(s - r["score"]) < 1e-9 for s, r in zip(got["scores"], want[k])), f"beam scores as the CLI's ({got['scores']})")
check(bad[0] == 400 and "prompts is not a list of strings" in str(bad[1]), f"a bad request: 400 and its field ({bad})")
ids_bos = ",".join(str(x) for x in [50256] + (want["greedy"][0]["prompt_ids"] if want["greedy"] else []))
want_bos = cli([], "--prompt-ids", ids_bos, "--max-new-tokens", "6", "--top-k", "1", "--seed", "7")
check(bos[0] == 200 and isinstance(bos[1], dict) and bos[1]["tokens"] == [r["ids"] for r in want_bos],
      f"add_BOS: the end-of-document id before the prompt, as Megatron's ({bos[1] if bos[0] != 200 else bos[1]['tokens']} "
      f"vs {[r['ids'] for r in want_bos]})")
srv.send_signal(signal.SIGTERM)
try:
    rest, _ = srv.communicate(timeout=30)
except subprocess.TimeoutExpired:
    srv.kill()
    rest, _ = srv.communicate()
check(srv.returncode == 0 and "server stopped after 6 requests" in rest, f"SIGTERM stops it (exit {srv.returncode}): {rest[-300:]}")

# --- interactive
p = subprocess.run([a.generate, "--load", ck, "--interactive", "--max-new-tokens", "5", "--temperature", "0"],
                   input="The jury said\nIn the city\nstop\nnever read\n", capture_output=True, text=True, timeout=120)
blocks = re.findall(r"----- \d+ \(.*?\)\n(.*)\n", p.stdout)
expect = [x["text"] for x in cli(["The jury said", "In the city"], "--max-new-tokens", "5", "--temperature", "0")]
check(p.returncode == 0 and blocks == [q + e for q, e in zip(["The jury said", "In the city"], expect)],
      f"--interactive answers each line as the command line does, and stops at 'stop' ({blocks} vs {expect})")

# --- stop strings, repetition penalty, beam search on the command line
s = want["stop"]
check(len(s) == 1 and s[0]["stop"] == "stop_sequence" and s[0]["text"].endswith(" the") and len(s[0]["ids"]) < 20,
      f"--stop ' the': ends at the token completing it ({s[0]['stop'] if s else None}: {s[0]['text'] if s else ''!r})")
plain = cli(["The jury said"], "--max-new-tokens", "12", "--temperature", "0")
pen = cli(["The jury said"], "--max-new-tokens", "12", "--temperature", "0", "--repetition-penalty", "3")
check(plain and pen and len(set(plain[0]["ids"])) < len(set(pen[0]["ids"])),
      f"--repetition-penalty 3: more distinct tokens ({len(set(plain[0]['ids'])) if plain else 0} -> "
      f"{len(set(pen[0]['ids'])) if pen else 0})")
b = cli(["The jury said"], "--max-new-tokens", "6", "--beam-width", "3")
check(len(b) == 3 and [x["score"] for x in b] == sorted((x["score"] for x in b), reverse=True) and
      all(abs(x["score"] - sum(x["logprobs"]) / len(x["ids"])) < 1e-9 for x in b),
      f"--beam-width 3: three hypotheses, best first, score = mean log-probability ({[x['score'] for x in b]})")
c.finish()
