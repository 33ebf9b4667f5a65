#!/usr/bin/env python3
"""SentencePiece tokenizers end to end, and Megatron-DeepSpeed's llama2 recipe (examples_deepspeed/
pretrain_llama2_distributed.sh, tests/apps/recipes/llama2.args) started unchanged at PP 1:

- a model trained here by Debian's spm_train (BPE with byte fallback, as Llama's);
- preprocess_data with --tokenizer-type GPTSentencePieceTokenizer gives, document for document, the
  ids `spm_encode --output_format=id` gives for the same text, then the model's </s> (--append-eod);
  Llama2Tokenizer the same after <s>; SentencePieceTokenizer (Megatron's) ends with its added <EOD>
  (the id after the model's pieces, <CLS> and <SEP>) and takes "<EOD>" in the text as that id;
- the recipe's flags and ds_config train to --train-iters at TP 1 and TP 2 (2 ranks) with finite
  losses; the checkpoint names the tokenizer by its model's fingerprint;
- generate encodes a text prompt as spm_encode does and decodes the continuation after it; given
  another model file it is refused in one line naming --tokenizer-model;
- hpct_ckpt export writes the run's model as tokenizer.model, byte for byte; that directory,
  given to finetune --load-hf with no tokenizer flag, trains on prompt/response data with its
  tokenizer.model as Llama2Tokenizer, and generate reads it there (and from the finetuned run);
- a missing --tokenizer-model and a file that is not a model are refused in one line.

sentencepiece_check.py --gpt PRETRAIN_GPT --preprocess PREPROCESS --generate GENERATE --finetune FINETUNE --tool HPCT_CKPT
                       --mpiexec MPIEXEC --recipes DIR --data DIR --workdir DIR
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, system_python_for, write_reverse_task  # noqa: E402  (tests/checklib.py)

system_python_for("numpy")
import numpy as np  # noqa: E402

c = Checks("--gpt", "--preprocess", "--generate", "--finetune", "--tool", "--mpiexec", "--recipes", "--data", "--workdir")
a, check = c.args, c.check
w = a.workdir

# --- a SentencePiece model and a corpus of one-line documents (spm_encode reads a line per text) ---
paragraphs = []
for i, line in enumerate(open(os.path.join(a.data, "brown.jsonl"))):
    if i >= 60:
        break
    paragraphs += [p.strip() for p in json.loads(line)["text"].split("\n") if p.strip()]
with open(os.path.join(w, "corpus.txt"), "w") as f:
    f.write("\n".join(paragraphs) + "\n")
model = os.path.join(w, "sp.model")
c.run(["spm_train", "--input=" + os.path.join(w, "corpus.txt"), "--model_prefix=" + os.path.join(w, "sp"),
       "--vocab_size=1000", "--model_type=bpe", "--byte_fallback=true", "--character_coverage=1.0", "--minloglevel=2"])
docs = paragraphs[:300] + ["A <EOD> inside the text, and unicode: caf\u00e9 \u4e2d\u6587 \U0001F600."]
with open(os.path.join(w, "docs.jsonl"), "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
with open(os.path.join(w, "docs.txt"), "w") as f:
    f.write("\n".join(docs) + "\n")
enc = c.run(["spm_encode", "--model=" + model, "--output_format=id", "--input=" + os.path.join(w, "docs.txt")])
ref = [[int(x) for x in ln.split()] for ln in enc.stdout.splitlines()]
pieces = 1000


def read_dataset(prefix):
    """Megatron's MMIDIDX .idx/.bin: the documents' ids."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", prefix
    code = idx[17]
    n, _ = struct.unpack_from("<QQ", idx, 18)
    sizes = np.frombuffer(idx, np.int32, n, 34)
    ptrs = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    dt = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}[code]
    data = np.fromfile(prefix + ".bin", dt)
    return [data[p // dt().itemsize:p // dt().itemsize + s].tolist() for p, s in zip(ptrs, sizes)]


def preprocess(kind, *extra, want=0):
    return c.run([a.preprocess, "--input", os.path.join(w, "docs.jsonl"), "--output-prefix", os.path.join(w, kind),
                  "--tokenizer-type", kind, *extra, "--append-eod", "--workers", "2"], want=want)


p = preprocess("GPTSentencePieceTokenizer", "--tokenizer-model", model)
got = read_dataset(os.path.join(w, "GPTSentencePieceTokenizer_text_document"))
check(len(ref) == len(docs) and got == [r + [2] for r in ref],
      f"GPTSentencePieceTokenizer: {len(got)} documents equal spm_encode's ids + </s> (2) "
      f"(first: {got[0][:8] if got else None} vs {ref[0][:8] if ref else None})")
p = preprocess("Llama2Tokenizer", "--tokenizer-model", model)
got = read_dataset(os.path.join(w, "Llama2Tokenizer_text_document"))
check(got == [[1] + r + [2] for r in ref], "Llama2Tokenizer: <s> (1), spm_encode's ids, </s> (2)")
p = preprocess("SentencePieceTokenizer", "--tokenizer-model", model)
got = read_dataset(os.path.join(w, "SentencePieceTokenizer_text_document"))
eod = pieces + 2  # <CLS> pieces, <SEP> pieces+1, <EOD> pieces+2
check(got[:-1] == [r + [eod] for r in ref[:-1]] and got and got[-1][-1] == eod and got[-1].count(eod) == 2,
      f"SentencePieceTokenizer: documents end with the added <EOD> ({eod}), which the text's '<EOD>' also gives "
      f"(last: {got[-1] if got else None})")
check("tokenizer SentencePieceTokenizer" in p.stdout, "preprocess_data names the tokenizer on its start line")

c.one_line_error("no --tokenizer-model", preprocess("GPTSentencePieceTokenizer", want=1), "preprocess_data",
                 ["--tokenizer-model", "GPTSentencePieceTokenizer needs"])
c.one_line_error("not a model", preprocess("GPTSentencePieceTokenizer", "--tokenizer-model", os.path.join(w, "docs.txt"), want=1),
                 "preprocess_data", [os.path.join(w, "docs.txt"), "is not a SentencePiece model"])

# --- the llama2 recipe, unchanged but for sizes, at TP 1 and TP 2 ---
data = os.path.join(w, "GPTSentencePieceTokenizer_text_document")


def recipe(label, tp):
    out = os.path.join(w, label)
    os.makedirs(out)
    cmd = [a.gpt, "@" + os.path.join(a.recipes, "llama2.args"), "--tensor-model-parallel-size", str(tp),
           "--pipeline-model-parallel-size", "1", "--tokenizer-model", model, "--data-path", "1", data,
           "--save", os.path.join(out, "ckpt"), "--load", os.path.join(out, "ckpt"),
           "--deepspeed_config=" + os.path.join(a.recipes, "llama2_ds_config.json"),
           "--json", os.path.join(out, "summary.json"), "--metrics-file", os.path.join(out, "m.jsonl")]
    if tp > 1:
        cmd = [a.mpiexec, "-n", str(tp), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), *cmd]
    p = c.run(cmd)
    s = json.load(open(os.path.join(out, "summary.json"))) if os.path.exists(os.path.join(out, "summary.json")) else {}
    recs = [json.loads(x) for x in open(os.path.join(out, "m.jsonl"))] if os.path.exists(os.path.join(out, "m.jsonl")) else []
    train = [r for r in recs if r.get("type") == "train"]
    check(p.returncode == 0 and s.get("exit_reason") == "completed" and len(train) == 3 and
          all(0 < r["lm_loss"] < 10 for r in train),
          f"llama2 recipe at TP {tp}: 3 iterations, losses {[round(r['lm_loss'], 3) for r in train]} "
          f"({s.get('exit_reason')})")
    check("> tokenizer GPTSentencePieceTokenizer" in p.stdout and "end-of-document id 2" in p.stdout,
          f"TP {tp}: the start line names the tokenizer and its end-of-document id")
    return out


r1 = recipe("llama2_tp1", 1)
recipe("llama2_tp2", 2)
ckpt = os.path.join(r1, "ckpt")
info = c.run([a.tool, "list", ckpt])
check("GPTSentencePieceTokenizer model:fnv1a64:" in info.stdout, "the checkpoint names its tokenizer by the model's fingerprint")

# --- generate: the prompt's ids are spm_encode's; the continuation follows the prompt's text ---
prompt = "The jury said"
want_ids = [int(x) for x in subprocess.run(["spm_encode", "--model=" + model, "--output_format=id"], input=prompt + "\n",
                                           capture_output=True, text=True).stdout.split()]
g = c.run([a.generate, "--load", ckpt, "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0",
           "--json", os.path.join(w, "gen.json")])
res = json.load(open(os.path.join(w, "gen.json")))["results"][0] if os.path.exists(os.path.join(w, "gen.json")) else {}
check(res.get("prompt_ids") == want_ids and len(res.get("ids", [])) == 6 and (prompt + res.get("text", "")) in g.stdout,
      f"generate: prompt ids {res.get('prompt_ids')} = spm_encode's {want_ids}; text after the prompt: {res.get('text')!r}")
other = os.path.join(w, "other")
c.run(["spm_train", "--input=" + os.path.join(w, "corpus.txt"), "--model_prefix=" + other, "--vocab_size=1000",
       "--model_type=unigram", "--minloglevel=2"])
c.one_line_error("another model", c.run([a.generate, "--load", ckpt, "--prompt", prompt, "--tokenizer-model", other + ".model"],
                                        want=1), "generate", ["--tokenizer-model", "is not the model file the checkpoint was trained with"])

# --- export: the run's model beside the weights, as Hugging Face names it ---
os.makedirs(os.path.join(w, "hf"))
c.run([a.tool, "export", ckpt, os.path.join(w, "hf", "model.safetensors")])
tm = os.path.join(w, "hf", "tokenizer.model")
check(os.path.exists(tm) and open(tm, "rb").read() == open(model, "rb").read(), "export: tokenizer.model is the run's model")

# --- weights from a Hugging Face directory bring their tokenizer: finetune and sample them ---
hf = os.path.join(w, "hf")
write_reverse_task(os.path.join(w, "sft.jsonl"), n=64)
shape = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "176", "--num-attention-heads", "4",
         "--num-key-value-heads", "2", "--seq-length", "32", "--max-position-embeddings", "32", "--swiglu",
         "--normalization", "rmsnorm", "--use-rotary-position-embeddings", "--untie-embeddings-and-output-weights",
         "--disable-bias-linear"]
ft = c.run([a.finetune, "--load-hf", hf, *shape, "--data-path", os.path.join(w, "sft.jsonl"), "--micro-batch-size", "4",
            "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-4", "--split", "90,10,0",
            "--save", os.path.join(w, "sft_ckpt"), "--save-interval", "2"])
check("> tokenizer Llama2Tokenizer " + os.path.join(hf, "tokenizer.model") in ft.stdout,
      "finetune --load-hf: the directory's tokenizer.model as Llama2Tokenizer, no tokenizer flag given")
g = c.run([a.generate, "--load-hf", hf, "--prompt", prompt, "--max-new-tokens", "3", "--temperature", "0",
           "--json", os.path.join(w, "gen_hf.json")])
res = json.load(open(os.path.join(w, "gen_hf.json")))["results"][0] if os.path.exists(os.path.join(w, "gen_hf.json")) else {}
check(res.get("prompt_ids") == [1] + want_ids, f"generate --load-hf: <s> then spm_encode's ids ({res.get('prompt_ids')})")
g = c.run([a.generate, "--load", os.path.join(w, "sft_ckpt"), "--prompt", prompt, "--max-new-tokens", "3", "--json",
           os.path.join(w, "gen_sft.json")])
res = json.load(open(os.path.join(w, "gen_sft.json")))["results"][0] if os.path.exists(os.path.join(w, "gen_sft.json")) else {}
check(res.get("prompt_ids") == [1] + want_ids, "generate on the finetuned checkpoint: the run's tokenizer, read from it")
c.finish()
