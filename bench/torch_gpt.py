#!/usr/bin/python3
"""The same GPT-2 model as hpctrain's, trained in PyTorch on CPU with mock tokens, for
bench/train_vs_pytorch.sh. Prints one JSON line: tokens_per_second, peak_rss_bytes (max over ranks).

Set-up as the benchmark issue prescribes: fp32 runs WORLD_SIZE DDP processes over gloo with one
thread each (started by the caller with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, since torchrun
fails on Debian's Python 3.11); bf16 runs one process with torch.autocast(cpu, bfloat16)."""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--vocab", type=int, required=True)
ap.add_argument("--layers", type=int, required=True)
ap.add_argument("--hidden", type=int, required=True)
ap.add_argument("--heads", type=int, required=True)
ap.add_argument("--seq", type=int, required=True)
ap.add_argument("--micro-batch", type=int, required=True)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--bf16", action="store_true")
a = ap.parse_args()

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(1234)


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, L, C, NH, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


Vp = (a.vocab + 127) // 128 * 128
model = GPT(Vp, a.layers, a.hidden, a.heads, a.seq)
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
g = torch.Generator().manual_seed(rank)
times = []
for it in range(a.warmup + a.iters):
    x = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if it >= a.warmup:
        times.append(time.perf_counter() - t0)
sec = sorted(times)[len(times) // 2]
tps = a.micro_batch * a.seq * world / sec
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if world > 1:
    t = torch.tensor([float(rss)])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    rss = int(t.item())
if rank == 0:
    print(json.dumps({"tokens_per_second": tps, "peak_rss_bytes": rss, "loss": float(loss)}), flush=True)
