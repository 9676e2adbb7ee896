#!/usr/bin/python3
"""PyTorch peer for kernels/bench/linear_attention.cc: the same chunked form
of linear attention with a data-dependent decay gate, forward + autograd
backward, CPU fp32.

  S_t = exp(g_t) S_{t-1} + k_t^T v_t,   o_t = scale q_t S_t

Chunks of L = 64 tokens: per chunk, b = cumsum(g) inside the chunk,
  o = scale (exp(b) * (Q S0) + (mask(Q K^T) * exp(b_r - b_j)) V)
  S = exp(b_L) S0 + (K * exp(b_L - b))^T V
batched over heads (and over chunks for the intra-chunk part); the state
recurrence loops over chunks.

Run (the fair-peer settings from shared/BUILD-NOTES.md):
  OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=2 /usr/bin/python3 \
      bench/pytorch/linear_attention_peer.py [--lengths 4096,16384]
FLOP convention: as the C++ bench (forward 4 L Dk Dv + 2 L^2 (Dk + Dv) per
chunk and head; backward 10 L Dk Dv + 2 L^2 (3 Dk + 2 Dv)).
"""
import argparse
import math
import resource
import time

import torch

L = 64


def chunked(q, k, v, g, scale):
    # q, k: [H, T, Dk]; v: [H, T, Dv]; g: [H, T]; T a multiple of L.
    h, t, dk = q.shape
    dv = v.shape[-1]
    n = t // L
    qc = q.reshape(h, n, L, dk)
    kc = k.reshape(h, n, L, dk)
    vc = v.reshape(h, n, L, dv)
    b = torch.cumsum(g.reshape(h, n, L), dim=-1)
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool))
    decay = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~mask, float('-inf')).exp()
    a = torch.matmul(qc, kc.transpose(-1, -2)) * decay * scale
    intra = torch.matmul(a, vc)
    kd = kc * (b[..., -1:] - b).exp().unsqueeze(-1)
    s = q.new_zeros(h, dk, dv)
    outs = []
    for c in range(n):
        outs.append(torch.matmul(qc[:, c], s) * (b[:, c].exp() * scale).unsqueeze(-1))
        s = s * b[:, c, -1].exp()[:, None, None] + torch.matmul(kd[:, c].transpose(-1, -2), vc[:, c])
    inter = torch.stack(outs, dim=1)
    return (intra + inter).reshape(h, t, dv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--lengths', default='4096,16384')
    ap.add_argument('--heads', type=int, default=8)
    ap.add_argument('--dim', type=int, default=64)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--threads', type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    h, d = args.heads, args.dim
    print(f'# torch {torch.__version__}, threads {torch.get_num_threads()}, '
          f'B=1 H={h} Dk=Dv={d}, gate, chunk {L}, fp32')
    print('| T | fwd ms | bwd ms | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd GFLOP/s | GFLOP per CPU-s |')
    print('|---|---|---|---|---|---|---|')
    for t in [int(x) for x in args.lengths.split(',')]:
        q = torch.rand(h, t, d) * 2 - 1
        k = torch.rand(h, t, d) * 2 - 1
        v = torch.rand(h, t, d) * 2 - 1
        g = -torch.rand(h, t) * 0.1
        for x in (q, k, v, g):
            x.requires_grad_(True)
        dout = torch.rand(h, t, d) * 2 - 1
        scale = 1.0 / math.sqrt(d)
        per_fwd = 4.0 * L * d * d + 2.0 * L * L * 2 * d
        per_bwd = 10.0 * L * d * d + 2.0 * L * L * 5 * d
        chunks = t / L * h
        best_f = best_b = 1e30
        cpu = 0.0
        for _ in range(args.reps):
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = chunked(q, k, v, g, scale)
            t1 = time.perf_counter()
            out.backward(dout)
            t2 = time.perf_counter()
            cpu = time.process_time() - c0
            best_f = min(best_f, t1 - t0)
            best_b = min(best_b, t2 - t1)
            for x in (q, k, v, g):
                x.grad = None
        ff, fb = per_fwd * chunks, per_bwd * chunks
        print(f'| {t} | {best_f * 1e3:.1f} | {best_b * 1e3:.1f} | {ff / best_f * 1e-9:.1f} | '
              f'{fb / best_b * 1e-9:.1f} | {(ff + fb) / (best_f + best_b) * 1e-9:.1f} | '
              f'{(ff + fb) / cpu * 1e-9:.1f} |')


if __name__ == '__main__':
    main()
