#!/usr/bin/env python3
"""PyTorch peer for Tandem's model benchmarks (docs/benchmarks.md).

A plain Llama-style decoder in eager PyTorch (Debian's python3-torch, CPU),
timed on the same shapes as `tandem-bench model`:
  train  : forward + backward + AdamW step, tokens/s
  decode : batched generation with a KV cache, tokens/s
  grpo   : a GRPO-shaped rollout as a static batch with a KV cache: the
           table of prompt and response lengths written by
           `bench_model --only grpo --grpo-table FILE`, each static batch
           (one prompt's G samples by default) left-padded and run until its
           longest response ends; tokens/s counts the table's response tokens

Run it the fair way on this machine (see ../shared/BUILD-NOTES.md):
  OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=2 /usr/bin/python3 \
      bench/pytorch/llama_peer.py --threads 2
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

CONFIGS = {
    "A": dict(vocab=512, hidden=256, layers=4, heads=8, kv_heads=2, inter=688, batch=8, seq=256),
    "B": dict(vocab=4096, hidden=512, layers=8, heads=8, kv_heads=4, inter=1376, batch=4, seq=512),
}


def rope_cache(seq, dim, theta=10000.0):
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    t = torch.arange(seq, dtype=torch.float32)
    f = torch.outer(t, inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, nh, nkv = c["hidden"], c["heads"], c["kv_heads"]
        self.nh, self.nkv, self.hd = nh, nkv, h // nh
        self.q = torch.nn.Linear(h, nh * self.hd, bias=False)
        self.k = torch.nn.Linear(h, nkv * self.hd, bias=False)
        self.v = torch.nn.Linear(h, nkv * self.hd, bias=False)
        self.o = torch.nn.Linear(nh * self.hd, h, bias=False)
        self.gate = torch.nn.Linear(h, c["inter"], bias=False)
        self.up = torch.nn.Linear(h, c["inter"], bias=False)
        self.down = torch.nn.Linear(c["inter"], h, bias=False)
        self.n1 = torch.nn.Parameter(torch.ones(h))
        self.n2 = torch.nn.Parameter(torch.ones(h))

    @staticmethod
    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def forward(self, x, cos, sin, cache=None, pos=0):
        B, T, _ = x.shape
        h = self.rms(x, self.n1)
        q = self.q(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        # Plain matmul-softmax-matmul attention (eager, as most RL stacks
        # run on CPU); causal mask over the full key range.
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        S = k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)
        x = x + self.o(y)
        h = self.rms(x, self.n2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.blocks = torch.nn.ModuleList([Block(c) for _ in range(c["layers"])])
        self.norm = torch.nn.Parameter(torch.ones(c["hidden"]))
        self.head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)
        self.cos, self.sin = rope_cache(4096, c["hidden"] // c["heads"])

    def forward(self, ids, caches=None, pos=0):
        x = self.emb(ids)
        for i, b in enumerate(self.blocks):
            x = b(x, self.cos, self.sin, None if caches is None else caches[i], pos)
        return self.head(Block.rms(x, self.norm))


def bench_train(c, iters, warmup):
    torch.manual_seed(0)
    m = Llama(c)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        loss = F.cross_entropy(m(x).reshape(-1, c["vocab"]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    tokens = c["batch"] * c["seq"]
    params = sum(p.numel() for p in m.parameters())
    t = sorted(times)[len(times) // 2]
    return dict(tokens_per_s=tokens / t, step_ms=t * 1e3, params=params)


@torch.no_grad()
def bench_decode(c, batch, prompt, new):
    torch.manual_seed(0)
    m = Llama(c).eval()
    ids = torch.randint(0, c["vocab"], (batch, prompt))
    t0 = time.perf_counter()
    caches = [dict() for _ in m.blocks]
    logits = m(ids, caches, 0)
    tok = logits[:, -1].argmax(-1, keepdim=True)
    t1 = time.perf_counter()
    for i in range(new - 1):
        logits = m(tok, caches, prompt + i)
        tok = logits[:, -1].argmax(-1, keepdim=True)
    t2 = time.perf_counter()
    return dict(tokens_per_s=batch * new / (t2 - t0), decode_tokens_per_s=batch * (new - 1) / (t2 - t1),
                prefill_ms=(t1 - t0) * 1e3)


@torch.no_grad()
def bench_grpo(c, table, prompts_per_batch):
    """Static batches of prompts_per_batch prompts x G samples; prompts
    left-padded (masked), responses forced to the table's lengths."""
    torch.manual_seed(0)
    m = Llama(c).eval()
    G = table["group_size"]
    plens, rlens = table["prompt_lengths"], table["response_lengths"]
    hd = c["hidden"] // c["heads"]
    want = sum(rlens)
    peak_kv = 0
    t0 = time.perf_counter()
    for b0 in range(0, len(plens), prompts_per_batch):
        ps = plens[b0:b0 + prompts_per_batch]
        rs = rlens[b0 * G:(b0 + len(ps)) * G]
        B, P, R = len(ps) * G, max(ps), max(rs)
        ids = torch.randint(0, c["vocab"], (B, P))
        pad = torch.tensor([P - ps[i // G] for i in range(B)])
        caches = [dict() for _ in m.blocks]
        # Left padding: padded keys are masked out of every query's row.
        keymask = torch.arange(P + R)[None, :] >= pad[:, None]
        x = m.emb(ids)
        for blk, cache in zip(m.blocks, caches):
            x = masked_block(blk, x, m.cos, m.sin, cache, 0, keymask[:, :P])
        logits = m.head(Block.rms(x, m.norm))
        tok = logits[:, -1].argmax(-1, keepdim=True)
        for i in range(R - 1):
            x = m.emb(tok)
            for blk, cache in zip(m.blocks, caches):
                x = masked_block(blk, x, m.cos, m.sin, cache, P + i, keymask[:, :P + i + 1])
            tok = m.head(Block.rms(x, m.norm))[:, -1].argmax(-1, keepdim=True)
        peak_kv = max(peak_kv, 2 * len(m.blocks) * B * (P + R) * c["kv_heads"] * hd * 4)
    t = time.perf_counter() - t0
    return dict(tokens_per_s=want / t, seconds=t, kv_peak_mb=peak_kv / 1e6)


def masked_block(blk, x, cos, sin, cache, pos, keymask):
    """Block.forward with a key mask [B, S] (positions shifted by padding are
    kept as they are: the cost, not the numerics, is what is compared)."""
    B, T, _ = x.shape
    h = blk.rms(x, blk.n1)
    q = blk.q(h).view(B, T, blk.nh, blk.hd).transpose(1, 2)
    k = blk.k(h).view(B, T, blk.nkv, blk.hd).transpose(1, 2)
    v = blk.v(h).view(B, T, blk.nkv, blk.hd).transpose(1, 2)
    c, s = cos[pos:pos + T], sin[pos:pos + T]
    q = q * c + rotate_half(q) * s
    k = k * c + rotate_half(k) * s
    if "k" in cache:
        k = torch.cat([cache["k"], k], dim=2)
        v = torch.cat([cache["v"], v], dim=2)
    cache["k"], cache["v"] = k, v
    rep = blk.nh // blk.nkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(blk.hd)
    S = k.shape[2]
    mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)[None, None] & keymask[:, None, None, :]
    att = att.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(0.0)
    y = (att @ v).transpose(1, 2).reshape(B, T, -1)
    x = x + blk.o(y)
    h = blk.rms(x, blk.n2)
    return x + blk.down(F.silu(blk.gate(h)) * blk.up(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", choices=["train", "decode", "grpo", "all"], default="all")
    ap.add_argument("--grpo-table", help="lengths written by bench_model --grpo-table (for --only grpo)")
    ap.add_argument("--grpo-prompts-per-batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": a.threads}
    if a.only in ("train", "all"):
        for name in ("A", "B"):
            out["train_" + name] = bench_train(CONFIGS[name], a.iters, a.warmup)
    if a.only in ("decode", "all"):
        out["decode_A"] = bench_decode(CONFIGS["A"], 16, 128, 128)
    if a.only == "grpo":
        with open(a.grpo_table) as f:
            table = json.load(f)
        out["grpo_A"] = bench_grpo(CONFIGS["A"], table, a.grpo_prompts_per_batch)
    if a.json:
        print(json.dumps(out))
        return
    print(f"PyTorch {out['torch']} CPU, {a.threads} threads")
    for k, v in out.items():
        if isinstance(v, dict):
            print(f"{k:10s} " + "  ".join(f"{kk}={vv:.1f}" if isinstance(vv, float) else f"{kk}={vv}"
                                          for kk, vv in v.items()))


if __name__ == "__main__":
    main()
