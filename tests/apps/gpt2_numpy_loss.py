#!/usr/bin/env python3
"""gpt2_numpy_loss.py SAFETENSORS HEADS SEED VOCAB T SAMPLE: the mean next-token loss that GPT-2,
as Hugging Face's GPT2LMHeadModel defines it, computes with the weights of a safetensors file on
one sample of hpctrain's mock data.

An independent reading of the export: GPT-2's names and layouts (Conv1D weights (in, out), x @ W
+ b; c_attn's columns split into query, key, value, heads contiguous), learned positions, pre-LN
blocks (eps 1e-5), causal softmax(q k^T / sqrt(d)), the tanh GELU ("gelu_new"), a final
LayerNorm and the output head tied to wte. Computed in float64 with numpy. The mock sample is
rebuilt from io::MockGptDataset's definition (splitmix64 streams of the seed). Prints the loss.
"""
import json
import struct
import sys

import numpy as np

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mock_sample(seed, V, T, i):
    s = splitmix64(seed ^ 0x6D6F636B64617461)
    table_key = splitmix64(s ^ 0x7375636365737372)
    succ = [splitmix64((table_key + v) & M64) % V for v in range(V)]
    key = splitmix64(s ^ splitmix64(i + 1))
    out = [splitmix64(key) % V]
    for t in range(1, T + 1):
        h = splitmix64((key + t) & M64)
        out.append((h >> 3) % V if (h & 7) == 0 else succ[out[-1]])
    return np.array(out)


def read_safetensors_f32(path):
    """Every tensor of an F32 safetensors file, as float64 arrays."""
    raw = open(path, "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hl])
    header.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + hl + v["data_offsets"][0]:8 + hl + v["data_offsets"][1]], dtype="<f4")
            .reshape(v["shape"]).astype(np.float64) for k, v in header.items()}


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logprobs(w, tokens, H):
    """log softmax of GPT-2's logits at every position of `tokens` (float64), weights `w` by GPT-2's
    names without a prefix."""
    T = len(tokens)
    L = sum(1 for k in w if k.endswith(".ln_1.weight"))
    C = w["wte.weight"].shape[1]
    D = C // H
    h = w["wte.weight"][tokens] + w["wpe.weight"][:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = f"h.{l}."
        a = layer_norm(h, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (x.reshape(T, H, D).transpose(1, 0, 2) for x in np.split(qkv, 3, axis=-1))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        y = (s / s.sum(-1, keepdims=True)) @ v
        h = h + y.transpose(1, 0, 2).reshape(T, C) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = layer_norm(h, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        h = h + gelu_new(m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    logits = layer_norm(h, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


if __name__ == "__main__":
    path, H, seed, V, T, sample = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    seq = mock_sample(seed, V, T, sample)
    tokens, targets = seq[:T], seq[1:T + 1]
    logp = gpt2_logprobs(read_safetensors_f32(path), tokens, H)
    print(f"{-logp[np.arange(T), targets].mean():.9f}")
