#!/usr/bin/env python3
"""GPT-2 weights in Hugging Face's layout, as a user brings them, through the one loader
(engine/hf_gpt2.hpp) that generate --load-hf and hpct_ckpt import share.

A save_pretrained-style directory is made here with numpy: random weights under GPT-2's names with
the "transformer." prefix GPT2LMHeadModel writes, Conv1D (in, out) weights, the tied lm_head.weight,
the h.N.attn.bias mask buffers of hub files, and config.json; in F32, F16 and BF16. Then:
- generate --load-hf, greedy, gives the tokens and log-probabilities of GPT-2's forward computed in
  float64 by numpy (gpt2_numpy_loss.py) on the same (16-bit rounded) weights: the same ids, the
  log-probabilities within 1e-4 (hpctrain computes in fp32);
- hpct_ckpt import of the directory, then generate --load of the checkpoint: the same ids;
- hpct_ckpt export writes config.json with the model's shape beside model.safetensors, and importing
  that directory again gives the same ids;
- a GPT-2 whose MLP is not 4 x n_embd wide (config.json's n_inner) gives numpy's forward too, and
  export writes that n_inner back;
- one-line errors naming the file and the tensor or key: an unknown tensor, a config.json that
  disagrees with the tensors (n_embd; n_inner null with a narrower MLP), another activation, the
  attention scalings GPT-2's config can switch (scale_attn_weights false,
  scale_attn_by_inverse_layer_idx true) that this GPT does not apply, an untied head.

hf_gpt2_check.py --generate GENERATE --tool HPCT_CKPT --workdir DIR
"""
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # numpy comes with Debian's python3-h5py (scripts/install_deps.sh): run under that python
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    raise

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..")]
from checklib import Checks  # noqa: E402  (tests/checklib.py)
from gpt2_numpy_loss import gpt2_logprobs  # noqa: E402

c = Checks("--generate", "--tool", "--workdir")
a, fails = c.args, c.fails
L, C, H, T, V = 2, 64, 4, 64, 300
rng = np.random.default_rng(5)


def weights(F=4 * C):
    w = {"wte.weight": rng.normal(0, 0.5, (V, C)), "wpe.weight": rng.normal(0, 0.1, (T, C)),
         "ln_f.weight": 1 + rng.normal(0, 0.1, C), "ln_f.bias": rng.normal(0, 0.1, C)}
    for l in range(L):
        p = f"h.{l}."
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = 1 + rng.normal(0, 0.1, C), rng.normal(0, 0.1, C)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = 1 + rng.normal(0, 0.1, C), rng.normal(0, 0.1, C)
        w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = rng.normal(0, 0.2, (C, 3 * C)), rng.normal(0, 0.1, 3 * C)
        w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = rng.normal(0, 0.2, (C, C)), rng.normal(0, 0.1, C)
        w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = rng.normal(0, 0.2, (C, F)), rng.normal(0, 0.1, F)
        w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = rng.normal(0, 0.1, (F, C)), rng.normal(0, 0.1, C)
    return w


def to_bits(x, dtype):
    """The array's bytes in a safetensors dtype, and the float64 values those bytes hold."""
    x32 = np.ascontiguousarray(x, dtype="<f4")
    if dtype == "F32":
        return x32.tobytes(), x32.astype(np.float64)
    if dtype == "F16":
        h = x32.astype("<f2")
        return h.tobytes(), h.astype(np.float64)
    u = x32.view("<u4").astype(np.uint64)  # BF16: round to nearest even
    b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return b.tobytes(), (b.astype("<u4") << 16).view("<f4").astype(np.float64)


def write_dir(d, w, dtype="F32", extra=None, config=None, prefix="transformer.", head=True):
    os.makedirs(d, exist_ok=True)
    tensors, seen = {}, {}
    for k, x in w.items():
        tensors[prefix + k], seen[k] = to_bits(x, dtype)
    if head:
        tensors["lm_head.weight"] = to_bits(w["wte.weight"], dtype)[0]
    for l in range(L):  # the causal-mask buffer hub files carry
        tensors[f"{prefix}h.{l}.attn.bias"] = np.tril(np.ones((T, T), dtype="<f4")).reshape(1, 1, T, T).tobytes()
    for k, v in (extra or {}).items():
        tensors[k] = v
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for k, b in tensors.items():
        shape = list(w[k[len(prefix):]].shape) if k.startswith(prefix) and k[len(prefix):] in w else (
            [V, C] if k == "lm_head.weight" else [1, 1, T, T] if k.endswith(".attn.bias") else [len(b) // 4])
        header[k] = {"dtype": "F32" if k.endswith(".attn.bias") or (extra and k in extra) else dtype, "shape": shape,
                     "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    cfg = {"model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": H, "n_positions": T, "vocab_size": V,
           "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    cfg.update(config or {})
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    return seen


sh = c.run


prompt = [5, 17, 250, 3, 99]


def generate(flag, path, name):
    out = os.path.join(a.workdir, name + ".json")
    sh([a.generate, flag, path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "10",
        "--temperature", "0", "--json", out])
    return json.load(open(out))["results"][0] if os.path.exists(out) else None


def greedy_numpy(seen):
    ctx, ids, lps = list(prompt), [], []
    for _ in range(10):
        lp = gpt2_logprobs(seen, np.array(ctx), H)[-1]
        nxt = int(np.argmax(lp))
        ids.append(nxt)
        lps.append(lp[nxt])
        ctx.append(nxt)
    return ids, lps


w = weights()
for dtype in ("F32", "F16", "BF16"):
    d = os.path.join(a.workdir, "hf_" + dtype)
    seen = write_dir(d, w, dtype)
    r = generate("--load-hf", d, "gen_" + dtype)
    if r is None:
        fails.append(f"{dtype}: generate wrote nothing")
        continue
    want_ids, want_lp = greedy_numpy(seen)
    gap = max(abs(x - y) for x, y in zip(r["logprobs"], want_lp)) if r["ids"] == want_ids else None
    ok = r["ids"] == want_ids and gap < 1e-4
    print(f"{'ok  ' if ok else 'FAIL'} {dtype}: ids {r['ids']} (numpy {want_ids}), largest log-probability gap {gap}")
    if not ok:
        fails.append(f"{dtype}: generate --load-hf differs from GPT-2's forward in numpy")
    if dtype == "F32":
        f32_ids = r["ids"]
        ck = os.path.join(a.workdir, "imported")
        sh([a.tool, "import", d, ck])
        r2 = generate("--load", ck, "gen_imported")
        if r2 is None or r2["ids"] != f32_ids:
            fails.append(f"import then --load: {r2 and r2['ids']} vs {f32_ids}")
        ex = os.path.join(a.workdir, "exported")
        os.makedirs(ex)
        sh([a.tool, "export", ck, os.path.join(ex, "model.safetensors")])
        cfg = json.load(open(os.path.join(ex, "config.json"))) if os.path.exists(os.path.join(ex, "config.json")) else {}
        if [cfg.get(k) for k in ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size")] != [L, C, H, T, V]:
            fails.append(f"exported config.json: {cfg}")
        r3 = generate("--load-hf", ex, "gen_exported")
        if r3 is None or r3["ids"] != f32_ids:
            fails.append(f"export then --load-hf: {r3 and r3['ids']} vs {f32_ids}")


# An MLP 96 wide (n_inner), not 4 x 64: the same forward as numpy's, kept through import and export.
narrow = weights(96)
d = os.path.join(a.workdir, "hf_n_inner")
seen = write_dir(d, narrow, config={"n_inner": 96})
r = generate("--load-hf", d, "gen_n_inner")
want_ids, want_lp = greedy_numpy(seen)
gap = max(abs(x - y) for x, y in zip(r["logprobs"], want_lp)) if r and r["ids"] == want_ids else None
print(f"{'ok  ' if gap is not None and gap < 1e-4 else 'FAIL'} n_inner 96: ids {r and r['ids']} (numpy {want_ids}), gap {gap}")
if gap is None or gap >= 1e-4:
    fails.append("n_inner 96: generate --load-hf differs from GPT-2's forward in numpy")
ck = os.path.join(a.workdir, "imported_n_inner")
sh([a.tool, "import", d, ck])
ex = os.path.join(a.workdir, "exported_n_inner")
os.makedirs(ex)
sh([a.tool, "export", ck, os.path.join(ex, "model.safetensors")])
cfg = json.load(open(os.path.join(ex, "config.json"))) if os.path.exists(os.path.join(ex, "config.json")) else {}
r3 = generate("--load-hf", ex, "gen_exported_n_inner")
if cfg.get("n_inner") != 96 or r3 is None or r3["ids"] != want_ids:
    fails.append(f"n_inner 96 through import and export: config n_inner {cfg.get('n_inner')}, ids {r3 and r3['ids']}")


def one_line_error(name, d, needles):
    c.one_line_error(name, sh([a.generate, "--load-hf", d, "--prompt-ids", "1,2"], want=None), "generate", needles)


bad = os.path.join(a.workdir, "bad_unknown")
write_dir(bad, w, extra={"transformer.h.0.attn.rotary": np.zeros(4, "<f4").tobytes()})
one_line_error("unknown tensor", bad, ["transformer.h.0.attn.rotary", "model.safetensors"])
bad = os.path.join(a.workdir, "bad_config")
write_dir(bad, w, config={"n_embd": 128})
one_line_error("config disagrees", bad, ["n_embd", "config.json"])
bad = os.path.join(a.workdir, "bad_act")
write_dir(bad, w, config={"activation_function": "relu"})
one_line_error("another activation", bad, ["activation_function"])
bad = os.path.join(a.workdir, "bad_n_inner")
write_dir(bad, narrow, config={"n_inner": None})
one_line_error("n_inner null, MLP 96 wide", bad, ["n_inner", "config.json", "96"])
for key, value in (("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True)):
    bad = os.path.join(a.workdir, "bad_" + key)
    write_dir(bad, w, config={key: value})
    one_line_error(key, bad, [key, "config.json"])
bad = os.path.join(a.workdir, "bad_head")
w2 = dict(w)
write_dir(bad, w2, head=False, extra={"lm_head.weight": to_bits(w["wte.weight"] * 2, "F32")[0]})
one_line_error("untied head", bad, ["lm_head.weight", "untied"])
c.finish()
