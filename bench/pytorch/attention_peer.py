#!/usr/bin/python3
"""PyTorch peer for kernels/bench/attention.cc: plain matmul-softmax-matmul
causal attention (no fused SDPA), forward + backward, CPU fp32.

Run (the fair-peer settings from shared/BUILD-NOTES.md):
  OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=2 /usr/bin/python3 \
      bench/pytorch/attention_peer.py [--lengths 1024,4096] [--reps N]

Shapes: B sequences of length T, H heads, D=64 (Hkv = H). FLOP convention
(same as the C++ bench): forward 4*T^2*D*H*B/2 (causal half), backward 2.5x
forward. PyTorch computes the full T x T product; we still count the causal
half, so its GFLOP/s is directly comparable with ours.
GFLOP per CPU-s: the same flops over the process CPU time (user + system,
all threads) per repetition, a figure that a loaded machine distorts less.
Extra memory: peak RSS (VmHWM, reset through /proc/self/clear_refs) minus RSS
with inputs and output gradients already allocated.
"""
import argparse
import math
import time

import torch


def rss_kb(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    return 0


def reset_peak():
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def attention(q, k, v, mask, scale):
    # q, k, v: [B, H, T, D]
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(mask, float('-inf'))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--lengths', default='1024,4096')
    ap.add_argument('--batch', type=int, default=4)
    ap.add_argument('--heads', type=int, default=8)
    ap.add_argument('--head-dim', type=int, default=64)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--threads', type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, h, d = args.batch, args.heads, args.head_dim
    print(f'# torch {torch.__version__}, threads {torch.get_num_threads()}, '
          f'B={b} H={h} D={d}, causal, fp32, plain matmul-softmax-matmul')
    print('| T | fwd ms | bwd ms | fwd+bwd ms | fwd+bwd GFLOP/s | '
          'GFLOP per CPU-s | extra MB |')
    print('|---|---|---|---|---|---|---|')
    for t in [int(x) for x in args.lengths.split(',')]:
        q = torch.randn(b, h, t, d, requires_grad=True)
        k = torch.randn(b, h, t, d, requires_grad=True)
        v = torch.randn(b, h, t, d, requires_grad=True)
        do = torch.randn(b, h, t, d)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scale = 1.0 / math.sqrt(d)
        # Warm-up (also allocates .grad once).
        o = attention(q, k, v, mask, scale)
        o.backward(do)
        del o
        base = rss_kb('VmRSS')
        reset_peak()
        fwd, bwd = [], []
        cpu0 = time.process_time()
        for _ in range(args.reps):
            q.grad = None; k.grad = None; v.grad = None
            t0 = time.perf_counter()
            o = attention(q, k, v, mask, scale)
            t1 = time.perf_counter()
            o.backward(do)
            t2 = time.perf_counter()
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            del o
        cpu_s = (time.process_time() - cpu0) / args.reps
        extra_mb = (rss_kb('VmHWM') - base) / 1024.0
        f_ms, b_ms = min(fwd) * 1e3, min(bwd) * 1e3
        flops = 4.0 * t * t * d * h * b / 2 * 3.5
        gflops = flops / ((f_ms + b_ms) * 1e-3) / 1e9
        print(f'| {t} | {f_ms:.1f} | {b_ms:.1f} | {f_ms + b_ms:.1f} | '
              f'{gflops:.1f} | {flops / cpu_s / 1e9:.1f} | {extra_mb:.0f} |',
              flush=True)
        del q, k, v, do, mask


if __name__ == '__main__':
    main()
