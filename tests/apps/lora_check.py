#!/usr/bin/env python3
"""finetune --lora-rank as a user runs it: a tiny GPT pretrained here on Brown for a few steps, then
LoRA-finetuned on prompt/response lines the test writes.

- the start line says what trains (the adapters, under 1% of the parameters) and what the frozen
  base holds; the response loss falls;
- its checkpoint holds the adapters (on the four linears and the embedding), the final norm and the
  position embedding (--lora-modules-to-save final_layernorm,position_embedding) only (hpct_ckpt
  verify passes);
- at --tensor-model-parallel-size 2 (2 ranks, the adapters split with their linears) the same run
  gives the one-rank losses within 1e-5 relative (the low-rank products summed over the group in
  another order: fp32 rounding, 3e-9 at step 1, grown to ~1e-6 by step 12 at this run's lr 1e-2, where
  Adam turns rounding in tiny gradients into whole steps; a missing sum or a doubled update is off by
  1e-3 or more);
- a requeued start resumes the adapters on the base it is given again; other base weights (the
  merged model's) are refused, naming the file;
- generate refuses the adapters alone with a one-line error that says how to merge them;
- hpct_ckpt merge-lora folds them into the base: --eval-only on the merged model gives the LoRA
  run's final validation loss (1e-5 relative: the same model, W + s B A summed in another order),
  and generate and export take it;
- one-line errors naming the flag: export of the adapters alone (the merge named; nothing written), a bad --lora-targets, LoRA without a base model, --finetune-resume-optimizer with LoRA, merge-lora without a base.

lora_check.py --gpt PRETRAIN_GPT --finetune FINETUNE --generate GENERATE --tool HPCT_CKPT --mpiexec MPIEXEC --args FILE
              --data DIR --workdir DIR
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checklib import Checks, write_reverse_task, system_python_for  # noqa: E402  (tests/checklib.py)

system_python_for("h5py", "numpy")
import h5py  # noqa: E402
import numpy as np  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
from ckpt_forge import set_tensor  # noqa: E402  (tests/engine/ckpt_forge.py)

c = Checks("--gpt", "--finetune", "--generate", "--tool", "--mpiexec", "--args", "--data", "--workdir")
a, check = c.args, c.check
tok = ["--vocab-file", os.path.join(a.data, "gpt2-vocab.json"), "--merge-file", os.path.join(a.data, "gpt2-merges.txt")]
brown = os.path.join(a.data, "brown_text_document")
pre = os.path.join(a.workdir, "pretrained")
c.run([a.gpt, "@" + a.args, "--data-path", brown, *tok, "--split", "949,50,1", "--train-iters", "6", "--eval-iters", "0",
       "--save", pre, "--save-interval", "6"])

sft = os.path.join(a.workdir, "reverse.jsonl")
write_reverse_task(sft)
lora = ["--lora-rank", "8", "--lora-alpha", "16", "--lora-targets", "qkv,proj,fc,fc2,embedding",
        "--lora-modules-to-save", "final_layernorm,position_embedding"]


def finetune(name, *extra, iters=12, want=0, launch=()):
    """A finetuning run on the reverse task, at --seq-length 32: every example (12 to 20 tokens) fits
    its sample at a quarter of the 128-token samples' cost (the weights keep their 128 positions)."""
    out = os.path.join(a.workdir, name)
    p = c.run([*launch, a.finetune, "@" + a.args, "--seq-length", "32", "--data-path", sft, *tok, "--split", "90,10,0",
               "--train-iters", str(iters),
               "--lr", "1e-2", "--lr-warmup-iters", "2", "--lr-decay-iters", "30", "--log-interval", "1",
               "--eval-interval", "1000", "--eval-iters", "2", "--metrics-file", out + ".jsonl", "--json", out + ".json",
               *extra], want=want)
    recs = [json.loads(line) for line in open(out + ".jsonl")] if os.path.exists(out + ".jsonl") else []
    return p, [r for r in recs if r.get("type") == "train"], (json.load(open(out + ".json")) if os.path.exists(out + ".json") else {})


ft = os.path.join(a.workdir, "ft")
p, tr, summ = finetune("ft", "--load", pre, *lora, "--save", ft, "--save-interval", "12")
# rank 8: 4 layers x 8 x 16 x 128 (the linears) + 8 x (50304 + 128) (the embedding) + 256 (the final norm)
# + 128 x 128 (the positions)
check("> LoRA rank 8 (alpha 16) on qkv,proj,fc,fc2,embedding: 485632 of 7717632 parameters train (6.29%)" in p.stdout,
      "the start line says what trains: " + next((x for x in p.stdout.splitlines() if x.startswith("> LoRA")), "(none)"))
check(len(tr) == 12, f"12 steps (got {len(tr)})")
if tr:
    check(tr[-1]["lm_loss"] < tr[0]["lm_loss"] - 0.2, f"the response loss falls: {tr[0]['lm_loss']:.3f} -> {tr[-1]['lm_loss']:.3f}")
final_val = summ.get("final_val_loss")

# Tensor parallelism: the same run on 2 ranks at T = 2.
mpi = [a.mpiexec, "-n", "2", "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
pt, trt, _ = finetune("ft_tp2", "--load", pre, *lora, "--tensor-model-parallel-size", "2", launch=mpi)
check("485632 of 7717632 parameters train" in pt.stdout and "tensor-parallel part" in pt.stdout,
      "at T=2 the start line counts the whole model and says the base is split")
worst = max((abs(x["lm_loss"] - y["lm_loss"]) / abs(y["lm_loss"]) for x, y in zip(trt, tr)), default=1.0)
check(len(trt) == len(tr) == 12 and worst <= 1e-5, f"T=2 gives the one-rank losses (worst {worst:.1e} relative over {len(trt)} steps)")

# The checkpoint: adapters only, and verify's checks pass.
v = c.run([a.tool, "verify", ft])
names = [x.split()[0] for x in v.stdout.splitlines() if x.strip().startswith("/")]
check(len(names) == 3 * (4 * 8 + 2 + 2 + 1) and sum("/lora_" in n for n in names) == 102 and
      sum("/final_layernorm/" in n for n in names) == 6 and sum("/position_embeddings/" in n for n in names) == 3,
      f"the checkpoint holds 3 x 34 adapter tensors, the final norm and the positions (--lora-modules-to-save), nothing else "
      f"(got {len(names)}: {names[:2]})")

# A requeued start: the same command resumes the adapters on the base it names.
p2, tr2, _ = finetune("ft_again", "--load", pre, *lora, "--save", ft, "--save-interval", "100", iters=14)
check("its LoRA adapters on the base" in p2.stdout and tr2 and tr2[0]["iteration"] == 13,
      f"a second start resumes the adapters (first iteration {tr2[0]['iteration'] if tr2 else None})")

# The adapters alone are not a model; merged into their base they are.
pg = c.run([a.generate, "--load", ft, "--prompt", "Reverse: apple river =>"], want=None)
c.one_line_error("generate on adapters", pg, "generate", ["LoRA adapters", "hpct_ckpt merge-lora"])
px = c.run([a.tool, "export", ft, os.path.join(a.workdir, "hf_adapters", "model.safetensors")], want=None)
c.one_line_error("export of adapters", px, "hpct_ckpt", ["LoRA adapters only", "hpct_ckpt merge-lora"])
check(not os.path.exists(os.path.join(a.workdir, "hf_adapters")), "export of adapters writes nothing")
merged = os.path.join(a.workdir, "merged")
c.run([a.tool, "merge-lora", os.path.join(ft, "iter_0000012.h5"), merged, "--base", pre])
_, _, se = finetune("eval_merged", "--load", merged, "--eval-only")
mv = se.get("final_val_loss")
check(final_val is not None and mv is not None and abs(mv - final_val) <= 1e-5 * abs(final_val),
      f"the merged model's validation loss {mv} is the LoRA run's final {final_val}")
g = c.run([a.generate, "--load", merged, "--prompt", "Reverse: apple river =>", "--max-new-tokens", "3", "--temperature", "0"])
check("generated" in g.stdout, "generate takes the merged model")
hf = os.path.join(a.workdir, "hf")
os.makedirs(hf, exist_ok=True)
c.run([a.tool, "export", merged, os.path.join(hf, "model.safetensors")])
check(os.path.exists(os.path.join(hf, "config.json")), "export writes the merged model with its config.json")
# The merged model is other base weights than the adapters were trained on: resuming them there is refused.
pw, _, _ = finetune("wrong_base", "--load", merged, *lora, "--save", ft, want=None)
c.one_line_error("adapters on another base", pw, "finetune", ["iter_0000014.h5", "other base weights", "--load"])

# One-line errors naming the flag.
pt = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--load", pre, "--lora-rank", "4", "--lora-targets", "qkv,mlp",
            "--train-iters", "1"], want=None)
c.one_line_error("an unknown --lora-targets entry", pt, "finetune", ["--lora-targets", "'mlp'"])
pn = c.run([a.gpt, "@" + a.args, "--mock-data", "--vocab-size", "512", "--lora-rank", "4", "--train-iters", "1"], want=None)
c.one_line_error("LoRA without a base model", pn, "pretrain_gpt", ["--lora-rank", "--load-hf"])
po = c.run([a.finetune, "@" + a.args, "--data-path", sft, *tok, "--load", pre, "--lora-rank", "4", "--finetune-resume-optimizer",
            "--train-iters", "1"], want=None)
c.one_line_error("--finetune-resume-optimizer with LoRA", po, "finetune", ["--finetune-resume-optimizer"])
pm = c.run([a.tool, "merge-lora", ft, os.path.join(a.workdir, "m2")], want=None)
c.one_line_error("merge-lora without a base", pm, "hpct_ckpt", ["--base"])
# Adapters holding a NaN under a valid checksum (a diverged run's): the merge is refused, naming the
# tensor, instead of writing a file that verifies (issue 47 item 5).
nan_dir = os.path.join(a.workdir, "nan_adapters")
os.makedirs(nan_dir)
shutil.copy(os.path.join(ft, "iter_0000012.h5"), nan_dir)
with h5py.File(os.path.join(nan_dir, "iter_0000012.h5"), "r+") as f:
    ds = "/model/layers/0/mlp/dense_h_to_4h/lora_b/weight"
    x = f[ds][...]
    x.reshape(-1)[3] = np.nan
    set_tensor(f, ds, x)
pn = c.run([a.tool, "merge-lora", os.path.join(nan_dir, "iter_0000012.h5"), os.path.join(a.workdir, "m_nan"), "--base", pre],
           want=None)
c.one_line_error("merge-lora of NaN adapters", pn, "hpct_ckpt", ["non-finite", "layers.0"])
check(not os.path.exists(os.path.join(a.workdir, "m_nan", "latest")), "no merged checkpoint was written")
# Into a directory of checkpoints: refused before anything is written (it repointed `latest` to its
# iteration 0, so a requeued --load X --save X restarted there; issue 47 item 9).
latest_before = open(os.path.join(ft, "latest")).read()
pd = c.run([a.tool, "merge-lora", os.path.join(ft, "iter_0000012.h5"), ft, "--base", pre], want=None)
c.one_line_error("merge-lora into a checkpoint directory", pd, "hpct_ckpt", [ft, "already holds checkpoints"])
check(open(os.path.join(ft, "latest")).read() == latest_before and not os.path.exists(os.path.join(ft, "iter_0000000.h5")),
      "the directory's `latest` is unchanged and no iteration-0 file was written")
c.finish()
