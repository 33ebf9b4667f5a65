#!/usr/bin/env python3
"""Llama weights in Hugging Face's layout (LlamaForCausalLM), as a user brings them from the hub,
through the loader every app's --load-hf shares (engine/hf_llama.hpp).

A save_pretrained-style directory is made here with numpy: random weights under Hugging Face's
names, config.json with grouped-query attention (4 query heads on 2 key/value heads), SwiGLU,
RMSNorm, rotary positions (rope_theta 500, so that a few positions turn the pairs visibly) and an
untied lm_head; in F32 as one model.safetensors, and in BF16 as two shards with
model.safetensors.index.json. Then:
- generate --load-hf, greedy, gives the tokens and log-probabilities of Hugging Face's Llama forward
  written out in float64 numpy below (rotate-half rotary positions, repeat_kv, RMSNorm eps 1e-5,
  silu(gate) * up): the same ids, the log-probabilities within 1e-5 (hpctrain computes in fp32);
- hpct_ckpt import of the directory, then generate --load of the checkpoint: the same ids; hpct_ckpt
  export of that checkpoint writes the same tensors, bit for bit, under the same names, and a
  LlamaForCausalLM config.json with the shape;
- a tied variant (tie_word_embeddings true, no lm_head) gives numpy's forward too;
- one-line errors naming the file and the key or tensor: rope_scaling, another rms_norm_eps, a
  tensor that is not part of the model, a directory with only pytorch_model.bin.

hf_llama_check.py --generate GENERATE --tool HPCT_CKPT --workdir DIR
"""
import json
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..")]
from checklib import Checks, system_python_for  # noqa: E402

system_python_for("numpy")
import numpy as np  # noqa: E402

c = Checks("--generate", "--tool", "--workdir")
a, fails = c.args, c.fails
L, C, NH, KV, F, V, T, THETA = 2, 32, 4, 2, 48, 300, 64, 500.0
D = C // NH
rng = np.random.default_rng(7)


def weights(tied=False):
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, C)), "model.norm.weight": 1 + rng.normal(0, 0.1, C)}
    if not tied:
        w["lm_head.weight"] = rng.normal(0, 0.3, (V, C))
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        w[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, C)
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.3, (C, C))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.3, (KV * D, C))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.3, (KV * D, C))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.2, (C, C))
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.3, (F, C))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.3, (F, C))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.2, (C, F))
    return w


def to_bits(x, dtype):
    """The array's bytes in a safetensors dtype, and the float64 values those bytes hold."""
    x32 = np.ascontiguousarray(x, dtype="<f4")
    if dtype == "F32":
        return x32.tobytes(), x32.astype(np.float64)
    u = x32.view("<u4").astype(np.uint64)  # BF16: round to nearest even
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return b.tobytes(), (b.astype("<u4") << 16).view("<f4").astype(np.float64)


def write_st(path, tensors):
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for k, (b, shape, dtype) in tensors.items():
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_dir(d, w, dtype="F32", shards=1, config=None, extra=None):
    os.makedirs(d, exist_ok=True)
    seen, tensors = {}, {}
    for k, x in w.items():
        b, seen[k] = to_bits(x, dtype)
        tensors[k] = (b, x.shape, dtype)
    for k, x in (extra or {}).items():
        tensors[k] = (to_bits(x, "F32")[0], x.shape, "F32")
    names = sorted(tensors)
    if shards == 1:
        write_st(os.path.join(d, "model.safetensors"), tensors)
    else:
        wmap = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: tensors[k] for k in names[s::shards]}
            write_st(os.path.join(d, fname), part)
            wmap.update({k: fname for k in part})
        json.dump({"metadata": {}, "weight_map": wmap}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C, "intermediate_size": F,
           "num_attention_heads": NH, "num_key_value_heads": KV, "num_hidden_layers": L, "max_position_embeddings": T,
           "vocab_size": V, "rms_norm_eps": 1e-5, "rope_theta": THETA, "hidden_act": "silu", "rope_scaling": None,
           "tie_word_embeddings": "lm_head.weight" not in w, "attention_bias": False, "mlp_bias": False,
           "torch_dtype": "float32" if dtype == "F32" else "bfloat16"}
    cfg.update(config or {})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return seen


def rms(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g


def llama_logprobs(w, ids):
    """Hugging Face's LlamaForCausalLM forward (modeling_llama.py), in float64: log-probabilities of
    the next token at every position."""
    n = len(ids)
    x = w["model.embed_tokens.weight"][ids]
    inv = 1.0 / (THETA ** (np.arange(0, D, 2) / D))
    ang = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(t):  # (n, heads, D): rotate_half
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos[:, None, :] + np.concatenate([-t2, t1], -1) * sin[:, None, :]

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, NH, D))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, KV, D))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, KV, D)
        k, v = np.repeat(k, NH // KV, axis=1), np.repeat(v, NH // KV, axis=1)  # repeat_kv
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", s, v).reshape(n, C) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    logits = x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


prompt = [5, 17, 250, 3, 99]
sh = c.run


def generate(flag, path, name):
    out = os.path.join(a.workdir, name + ".json")
    sh([a.generate, flag, path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "10",
        "--temperature", "0", "--json", out])
    return json.load(open(out))["results"][0] if os.path.exists(out) else None


def greedy_numpy(seen):
    ctx, ids, lps = list(prompt), [], []
    for _ in range(10):
        lp = llama_logprobs(seen, np.array(ctx))[-1]
        nxt = int(np.argmax(lp))
        ids.append(nxt)
        lps.append(lp[nxt])
        ctx.append(nxt)
    return ids, lps


def against_numpy(name, d, seen):
    r = generate("--load-hf", d, "gen_" + name)
    want_ids, want_lp = greedy_numpy(seen)
    gap = max(abs(x - y) for x, y in zip(r["logprobs"], want_lp)) if r and r["ids"] == want_ids else None
    ok = gap is not None and gap < 1e-5
    c.check(ok, f"{name}: ids {r and r['ids']} (numpy {want_ids}), largest log-probability gap {gap}")
    return r


w = weights()
d32 = os.path.join(a.workdir, "llama_f32")
r32 = against_numpy("F32, one file", d32, write_dir(d32, w))
dbf = os.path.join(a.workdir, "llama_bf16")
against_numpy("BF16, two shards", dbf, write_dir(dbf, w, "BF16", shards=2))
if r32:
    ck = os.path.join(a.workdir, "imported")
    sh([a.tool, "import", d32, ck])
    r2 = generate("--load", ck, "gen_imported")
    c.check(r2 is not None and r2["ids"] == r32["ids"], f"import then --load: {r2 and r2['ids']} vs {r32['ids']}")
    ex = os.path.join(a.workdir, "exported")
    os.makedirs(ex)
    sh([a.tool, "export", ck, os.path.join(ex, "model.safetensors")])
    raw = open(os.path.join(ex, "model.safetensors"), "rb").read()
    hl = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + hl])
    got = {k: np.frombuffer(raw[8 + hl + v["data_offsets"][0]: 8 + hl + v["data_offsets"][1]], "<f4").reshape(v["shape"])
           for k, v in hdr.items() if k != "__metadata__"}
    want32 = {k: np.asarray(x, dtype="<f4") for k, x in w.items()}
    same = set(got) == set(want32) and all(np.array_equal(got[k], want32[k]) for k in want32)
    c.check(same, f"export writes the imported tensors bit for bit ({len(got)} of {len(want32)})")
    cfg = json.load(open(os.path.join(ex, "config.json"))) if os.path.exists(os.path.join(ex, "config.json")) else {}
    c.check([cfg.get(k) for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                  "num_key_value_heads", "intermediate_size", "vocab_size", "rope_theta")] ==
            ["llama", L, C, NH, KV, F, V, THETA], f"exported config.json: {cfg}")
dt = os.path.join(a.workdir, "llama_tied")
against_numpy("tied embeddings", dt, write_dir(dt, weights(tied=True)))


def one_line_error(name, d, needles):
    c.one_line_error(name, sh([a.generate, "--load-hf", d, "--prompt-ids", "1,2"], want=None), "generate", needles)


bad = os.path.join(a.workdir, "bad_rope_scaling")
write_dir(bad, w, config={"rope_scaling": {"type": "linear", "factor": 2.0}})
one_line_error("rope_scaling", bad, ["rope_scaling", "config.json"])
bad = os.path.join(a.workdir, "bad_eps")
write_dir(bad, w, config={"rms_norm_eps": 1e-6})
one_line_error("rms_norm_eps", bad, ["rms_norm_eps", "config.json"])
bad = os.path.join(a.workdir, "bad_extra")
write_dir(bad, w, extra={"model.layers.0.self_attn.q_norm.weight": np.ones(C)})
one_line_error("unknown tensor", bad, ["model.layers.0.self_attn.q_norm.weight", "model.safetensors"])
bad = os.path.join(a.workdir, "bad_bin")
write_dir(bad, w)
os.remove(os.path.join(bad, "model.safetensors"))  # as older hub repositories: a pickle only
open(os.path.join(bad, "pytorch_model.bin"), "wb").write(b"\x80\x02")
one_line_error("pytorch_model.bin only", bad, ["safetensors", "pytorch_model.bin"])
c.finish()
