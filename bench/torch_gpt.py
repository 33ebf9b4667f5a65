#!/usr/bin/python3
"""The same GPT-2 model as hpctrain's, trained in PyTorch with mock tokens, for
bench/train_vs_pytorch.sh (CPU) and bench/gpu_train.sh (--device cuda: one GPU). Prints one JSON line: tokens_per_second, peak_rss_bytes (max over ranks).
With --experts E: every --expert-interval-th layer's MLP is DeepSpeed's MoE layer as DeepSpeed
writes it (sharded_moe.py top1gating and MOELayer): fp32 router, top-1, capacity
ceil(S/E x factor) at least 4, Random Token Selection, the aux loss (x 0.01), one-hot combine and
dispatch tensors (S, E, C) and the einsum dispatch "sec,sm->ecm" / combine "sec,ecm->sm", each
expert a GPT MLP run on its (C, h) slice, in one process (DeepSpeed's layer without expert
parallelism: no all-to-all).

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
ap.add_argument("--experts", type=int, default=0)
ap.add_argument("--expert-interval", type=int, default=2)
ap.add_argument("--capacity-factor", type=float, default=1.0)
ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: one GPU, bf16 autocast on it")
ap.add_argument("--sdpa", action="store_true", help="attention through F.scaled_dot_product_attention (flash)")
ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (gradient accumulation)")
ap.add_argument("--llama", action="store_true",
                help="Llama-shaped: RMSNorm, SwiGLU (--ffn wide), rotary positions, no biases, untied head")
ap.add_argument("--kv-heads", type=int, default=0, help="--llama: key/value heads (grouped-query attention; 0: heads)")
ap.add_argument("--ffn", type=int, default=0, help="--llama: the SwiGLU width")
a = ap.parse_args()
dev = torch.device(a.device)

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(1234)


class Mlp(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return self.fcproj(F.gelu(self.fc(x), approximate="tanh"))


class MoE(nn.Module):
    """DeepSpeed's top-1 MoE layer (sharded_moe.py: top1gating with RTS, MOELayer's einsums)."""

    def __init__(self, C, E, factor, min_capacity=4):
        super().__init__()
        self.wg = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList(Mlp(C) for _ in range(E))
        self.E, self.factor, self.min_capacity = E, factor, min_capacity

    def forward(self, x):  # x (S, C) -> (S, C), l_aux
        S, E = x.shape[0], self.E
        with torch.autocast(a.device, enabled=False):  # DeepSpeed's gate runs in fp32
            gates = F.softmax(self.wg(x.float()), dim=1)
        cap = max(math.ceil(S / E * self.factor), self.min_capacity)
        mask1 = F.one_hot(gates.argmax(dim=1), num_classes=E)
        l_aux = torch.mean(gates.mean(dim=0) * mask1.float().mean(dim=0)) * E * E
        # Random Token Selection: per expert, the cap tokens with the highest uniform priority
        top = torch.topk(mask1 * torch.rand(S, 1, device=x.device), k=cap, dim=0)[1]
        mask1 = mask1 * torch.zeros_like(mask1).scatter_(0, top, 1)
        locations1 = torch.cumsum(mask1, dim=0) - 1
        locations1_s = torch.sum(locations1 * mask1, dim=1)
        gates1_s = (gates * mask1).sum(dim=1)
        combine = torch.einsum("se,sc->sec", gates1_s.unsqueeze(1) * mask1, F.one_hot(locations1_s, num_classes=cap).float())
        dispatch = combine.bool().type_as(x)
        dispatched = torch.einsum("sec,sm->ecm", dispatch, x)
        out = torch.stack([self.experts[e](dispatched[e]) for e in range(E)])
        return torch.einsum("sec,ecm->sm", combine.type_as(out), out), l_aux


class RMSNorm(nn.Module):  # torch 1.13 has none: Llama's, eps 1e-5
    def __init__(self, C):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def rotate(t, cos, sin):  # (B, heads, T, d): Hugging Face's rotate_half form
    d = t.shape[-1]
    return t * cos + torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, C, NH, KV, Fw):
        super().__init__()
        self.ln1, self.ln2 = RMSNorm(C), RMSNorm(C)
        self.d, self.NH, self.KV = C // NH, NH, KV
        self.qkv = nn.Linear(C, C + 2 * KV * (C // NH), bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.gate, self.up, self.down = nn.Linear(C, Fw, bias=False), nn.Linear(C, Fw, bias=False), nn.Linear(Fw, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([C, self.KV * self.d, self.KV * self.d], dim=2)
        q = rotate(q.view(B, T, self.NH, self.d).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, self.KV, self.d).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.KV, self.d).transpose(1, 2)
        k, v = (t.repeat_interleave(self.NH // self.KV, dim=1) for t in (k, v))  # repeat_kv
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        y = (att.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, V, L, C, NH, KV, Fw):
        super().__init__()
        self.wte, self.head = nn.Embedding(V, C), nn.Linear(C, V, bias=False)
        self.blocks = nn.ModuleList(LlamaBlock(C, NH, KV, Fw) for _ in range(L))
        self.lnf, self.d = RMSNorm(C), C // NH

    def forward(self, idx, targets):
        T = idx.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, device=idx.device).float() / self.d))
        ang = torch.outer(torch.arange(T, device=idx.device).float(), inv)
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class Block(nn.Module):
    def __init__(self, C, NH, experts=0, factor=1.0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.mlp = MoE(C, experts, factor) if experts > 1 else Mlp(C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if a.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        if isinstance(self.mlp, MoE):
            out, l_aux = self.mlp(self.ln2(x).view(B * T, C))
            return x + out.view(B, T, C), l_aux
        return x + self.mlp(self.ln2(x)), None


class GPT(nn.Module):
    def __init__(self, V, L, C, NH, T, experts=0, interval=2, factor=1.0):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        # MoE on layers l (1-based) with l % interval == 0, as Megatron-DeepSpeed numbers them
        self.blocks = nn.ModuleList(Block(C, NH, experts if (l + 1) % interval == 0 else 0, factor) for l in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        aux = 0.0
        for b in self.blocks:
            x, l_aux = b(x)
            if l_aux is not None:
                aux = aux + l_aux
        logits = self.lnf(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1)) + 0.01 * aux


Vp = (a.vocab + 127) // 128 * 128
if a.llama:
    model = Llama(Vp, a.layers, a.hidden, a.heads, a.kv_heads or a.heads, a.ffn).to(dev)
else:
    model = GPT(Vp, a.layers, a.hidden, a.heads, a.seq, a.experts, a.expert_interval, a.capacity_factor).to(dev)
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
# On a GPU the fused AdamW (one kernel over every tensor), as the step it is compared with.
# (Only asked for there: Debian's CPU torch 1.13 has no `fused` argument.)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **({"fused": True} if a.device == "cuda" else {}))
g = torch.Generator().manual_seed(rank)
times = []
for it in range(a.warmup + a.iters):
    xs = [torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g).to(dev) for _ in range(a.accum)]
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for x in xs:
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(x[:, :-1], x[:, 1:]) / a.accum
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if a.device == "cuda":
        torch.cuda.synchronize()
    if it >= a.warmup:
        times.append(time.perf_counter() - t0)
sec = sorted(times)[len(times) // 2]
tps = a.micro_batch * a.accum * a.seq * world / sec
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if world > 1:
    t = torch.tensor([float(rss)])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    rss = int(t.item())
if rank == 0:
    out = {"tokens_per_second": tps, "peak_rss_bytes": rss, "loss": float(loss), "step_seconds": sec}
    if a.device == "cuda":
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(out), flush=True)
