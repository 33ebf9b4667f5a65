#!/usr/bin/env python3
"""The model options Megatron spells as flags, each part of the model everywhere it is written.

--ffn-hidden-size:
- pretrain_gpt trains a model whose MLPs are 48 wide (hidden 32: not 4 x 32), says so at start, and
  its checkpoint records ffn_hidden_size 48 (hpct_ckpt list);
- generate loads it; a resume at another width is refused in one line naming the MLP's tensor and
  both shapes;
- a checkpoint written before the key existed (the key removed, the run-state checksum recomputed)
  resumes at the default 4 x hidden;
- a width the tensor-parallel size does not divide is refused naming --ffn-hidden-size.

--normalization rmsnorm:
- trains on 2 ranks, says so at start, and the checkpoint records it and has no norm biases;
- generate loads it; a resume with LayerNorm is refused in one line naming the missing bias; export
  (which writes GPT-2) is refused in one line; an unknown kind is refused naming the flag.

--swiglu --disable-bias-linear --untie-embeddings-and-output-weights --use-rotary-position-embeddings
--num-key-value-heads 2 of 4 heads (with RMSNorm, on 2 tensor-parallel ranks with sequence
parallelism): a Llama-shaped model.
- trains at Megatron's default width int(4 x 32 x 2/3 / 64) x 64 = 64, says so at start; the
  checkpoint records swiglu, the width and no linear biases, its fc holds gate and up (128 x 32)
  and it has no bias tensor at all, an output layer of its own (384 x 32), no position table and a
  query_key_value of 32 + 2 x 2 x 8 rows; generate loads it; hpct_ckpt export writes it as a
  LlamaForCausalLM directory that generate --load-hf reads back to the same tokens.

model_options_check.py --gpt PRETRAIN_GPT --tool HPCT_CKPT --generate GENERATE --mpi "MPIRUN -np 2 ..." --workdir DIR
"""
import json
import os
import shlex
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, ".."), os.path.join(here, "..", "engine")]
from checklib import Checks, system_python_for  # noqa: E402

system_python_for("h5py")
import h5py  # noqa: E402
from ckpt_forge import rechecksum  # noqa: E402

c = Checks("--gpt", "--tool", "--generate", "--mpi", "--workdir")
a = c.args
base = ["--mock-data", "--vocab-size", "300", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--lr-decay-iters", "10", "--eval-iters", "0",
        "--log-interval", "1"]


def latest(d):
    return os.path.join(d, open(os.path.join(d, "latest")).read().split()[0]) if os.path.exists(os.path.join(d, "latest")) else d


narrow = os.path.join(a.workdir, "narrow")
p = c.run([a.gpt, *base, "--ffn-hidden-size", "48", "--train-iters", "2", "--save", narrow])
c.check("MLP width 48" in p.stdout, "the start line describes the MLP width")
p = c.run([a.tool, "list", narrow])
arch = next((l for l in p.stdout.splitlines() if l.startswith("# architecture:")), "")
c.check('"ffn_hidden_size":48' in arch.replace(" ", ""), f"the checkpoint records the width ({arch[:160]})")
c.run([a.generate, "--load", narrow, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--temperature", "0"])
p = c.run([a.gpt, *base, "--ffn-hidden-size", "64", "--train-iters", "3", "--load", narrow], want=None)
c.one_line_error("resume at another width", p, "pretrain_gpt", ["dense_h_to_4h", "[48, 32]", "[64, 32]"])

# A checkpoint from before the key: resumes at 4 x hidden.
old = os.path.join(a.workdir, "old")
c.run([a.gpt, *base, "--train-iters", "2", "--save", old])
with h5py.File(latest(old), "r+") as f:
    arch = json.loads(f.attrs["architecture"])
    c.check(arch.pop("ffn_hidden_size", None) == 128, "a default run records 4 x hidden")
    f.attrs["architecture"] = json.dumps(arch)
    rechecksum(f)
p = c.run([a.gpt, *base, "--train-iters", "3", "--load", old])
c.check("iteration        3/" in p.stdout or "iteration 3/" in " ".join(p.stdout.split()),
        "the key-less checkpoint resumes and trains iteration 3")

p = c.run(shlex.split(a.mpi) + [a.gpt, *base, "--ffn-hidden-size", "47", "--tensor-model-parallel-size", "2",
                                "--train-iters", "1"], want=None)
c.check(p.returncode != 0 and "--ffn-hidden-size" in p.stdout + p.stderr and "not divisible" in p.stdout + p.stderr,
        "a width T does not divide is refused naming --ffn-hidden-size")
# --normalization rmsnorm
rms = os.path.join(a.workdir, "rms")
p = c.run(shlex.split(a.mpi) + [a.gpt, *base, "--normalization", "rmsnorm", "--global-batch-size", "4",
                                "--train-iters", "2", "--save", rms])
c.check("rmsnorm" in p.stdout, "the start line names the norm")
losses = [float(x.split("lm loss:")[1].split("|")[0]) for x in p.stdout.splitlines() if "lm loss:" in x]
c.check(len(losses) == 2 and all(l == l and 0 < l < 20 for l in losses), f"finite losses {losses}")
if os.path.exists(os.path.join(rms, "latest")):
    with h5py.File(latest(rms), "r") as f:
        arch = json.loads(f.attrs["architecture"])
        names = []
        f.visit(names.append)
    c.check(arch.get("normalization") == "rmsnorm", f"the architecture records rmsnorm ({arch.get('normalization')})")
    c.check(any(n.endswith("input_layernorm/weight") for n in names) and not any(n.endswith("layernorm/bias") for n in names),
            "the checkpoint has norm weights and no norm biases")
c.run([a.generate, "--load", rms, "--prompt-ids", "1,2,3", "--max-new-tokens", "4", "--temperature", "0"])
p = c.run([a.gpt, *base, "--train-iters", "3", "--global-batch-size", "4", "--load", rms], want=None)
c.one_line_error("resume with layernorm", p, "pretrain_gpt", ["input_layernorm/bias"])
p = c.run([a.tool, "export", rms, os.path.join(a.workdir, "rms_export", "model.safetensors")], want=None)
c.one_line_error("export of an RMSNorm model", p, "hpct_ckpt", ["rmsnorm", "GPT-2"])
c.check(not os.path.exists(os.path.join(a.workdir, "rms_export", "model.safetensors")), "export wrote nothing")
p = c.run([a.gpt, *base, "--normalization", "batchnorm", "--train-iters", "1"], want=None)
c.one_line_error("unknown kind", p, "pretrain_gpt", ["--normalization", "batchnorm", "rmsnorm"])
# --swiglu
glu = os.path.join(a.workdir, "glu")
p = c.run(shlex.split(a.mpi) + [a.gpt, *base, "--swiglu", "--disable-bias-linear", "--normalization", "rmsnorm",
                                "--untie-embeddings-and-output-weights", "--use-rotary-position-embeddings",
                                "--num-attention-heads", "4", "--num-key-value-heads", "2",
                                "--tensor-model-parallel-size", "2",
                                "--sequence-parallel", "--train-iters", "2", "--save", glu])
c.check("SwiGLU" in p.stdout and "MLP width 64" in p.stdout and "no linear biases" in p.stdout and
        "rotary positions (8 channels, theta 10000)" in p.stdout and "4 heads (2 key/value heads)" in p.stdout,
        "the start line names SwiGLU, its default width, no linear biases, rotary positions and the key/value heads")
if os.path.exists(os.path.join(glu, "latest")):
    with h5py.File(latest(glu), "r") as f:
        arch = json.loads(f.attrs["architecture"])
        fc = f["model/layers/0/mlp/dense_h_to_4h/weight"].shape
        head = f["model/output_layer/weight"].shape if "model/output_layer/weight" in f else None
        qkv = f["model/layers/0/attention/query_key_value/weight"].shape
        names = []
        f["model"].visit(names.append)
    c.check(arch.get("swiglu") is True and arch.get("ffn_hidden_size") == 64 and arch.get("add_bias_linear") is False,
            f"the architecture records swiglu, width 64, no linear biases ({arch.get('swiglu')}, "
            f"{arch.get('ffn_hidden_size')}, {arch.get('add_bias_linear')})")
    c.check(not any(n.endswith("/bias") for n in names), f"no bias tensor ({[n for n in names if n.endswith('/bias')][:3]})")
    c.check(head is not None and tuple(head) == (384, 32) and arch.get("untie_embeddings_and_output_weights") is True,
            f"an output layer of its own, whole ({head})")
    c.check(tuple(qkv) == (64, 32) and arch.get("num_key_value_heads") == 2,
            f"grouped query_key_value, whole ({qkv}, {arch.get('num_key_value_heads')} key/value heads)")
    c.check(arch.get("position_embedding_type") == "rope" and arch.get("rope_theta") == 10000 and
            not any("position_embeddings" in n for n in names), f"rotary positions, no table ({arch.get('position_embedding_type')})")
    c.check(tuple(fc) == (128, 32), f"fc holds gate and up, whole in the checkpoint ({fc})")


def ids(flag, path):
    out = os.path.join(a.workdir, "ids.json")
    c.run([a.generate, flag, path, "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--temperature", "0", "--json", out])
    return json.load(open(out))["results"][0]["ids"] if os.path.exists(out) else None


from_ckpt = ids("--load", glu)
ex = os.path.join(a.workdir, "glu_export")
os.makedirs(ex)
c.run([a.tool, "export", glu, os.path.join(ex, "model.safetensors")])
hf_cfg = json.load(open(os.path.join(ex, "config.json"))) if os.path.exists(os.path.join(ex, "config.json")) else {}
c.check(hf_cfg.get("model_type") == "llama" and hf_cfg.get("num_key_value_heads") == 2 and hf_cfg.get("intermediate_size") == 64
        and hf_cfg.get("tie_word_embeddings") is False, f"exported as LlamaForCausalLM ({hf_cfg.get('architectures')})")
c.check(from_ckpt is not None and ids("--load-hf", ex) == from_ckpt, f"the exported Llama gives the checkpoint's tokens {from_ckpt}")
c.finish()
