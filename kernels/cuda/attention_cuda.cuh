// Shared pieces of the CUDA attention kernels: argument blocks, the
// visibility rule, key/query ranges of a tile, and the varlen tile lookup.
//
// Visibility (as the reference, kernels/ref/attention_ref_math.h): key j is
// visible from query i (positions inside one sequence) when
//   causal:     i - window < j <= i
//   non-causal: i - window < j <  i + window   (symmetric window)
// with window <= 0 meaning unlimited; causal with a window, keys j < sinks
// are visible too.
#pragma once

#if !defined(TANDEM_CUDA_EMULATION)
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cuda {

// Tiles use a 16 x 16 thread layout (256 threads): thread (ty, tx) owns rows
// ty + 16 i and columns tx + 16 j of every tile it touches.
constexpr int kAttnThreads = 256;

struct AttnFwdArgs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  float* lse;
  const int32_t* cu_seqlens;
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  bool causal;
  int window;
  int sinks;  // attention sinks (causal, windowed): keys j < sinks stay visible
  float scale;
  int skip_query_rows;  // AttentionParams::skip_query_rows
};

struct AttnBwdArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* dout;
  const float* lse;
  const float* delta;  // rowsum(dout * out) [T, H]
  float* dq;           // zeroed, accumulated with atomicAdd
  float* dk;
  float* dv;
  const int32_t* cu_seqlens;
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  bool causal;
  int window;
  int sinks;  // attention sinks (causal, windowed): keys j < sinks stay visible
  float scale;
  int skip_query_rows;  // AttentionParams::skip_query_rows
};

// The argument blocks of one call, from the op's parameters (the CUDA ops
// and their CPU emulation build them here alike).
inline float AttnScale(const AttentionParams& p) {
  return p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.head_dim));
}

inline AttnFwdArgs FwdArgsOf(const AttentionParams& p, const float* q, const float* k, const float* v, float* out,
                             float* lse, const int32_t* cu_seqlens, int num_seqs) {
  return {
      q,          k,        v,        out,     lse,          cu_seqlens,       num_seqs, p.num_heads, p.num_kv_heads,
      p.head_dim, p.causal, p.window, p.sinks, AttnScale(p), p.skip_query_rows};
}

inline AttnBwdArgs BwdArgsOf(const AttentionParams& p, const float* q, const float* k, const float* v,
                             const float* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv,
                             const int32_t* cu_seqlens, int num_seqs) {
  return {q,
          k,
          v,
          dout,
          lse,
          delta,
          dq,
          dk,
          dv,
          cu_seqlens,
          num_seqs,
          p.num_heads,
          p.num_kv_heads,
          p.head_dim,
          p.causal,
          p.window,
          p.sinks,
          AttnScale(p),
          p.skip_query_rows};
}

__device__ __forceinline__ bool Visible(int i, int j, bool causal, int window, int sinks) {
  if (causal && j > i) return false;
  if (window <= 0) return true;
  if (causal && j < sinks) return true;
  return j > i - window && (causal || j < i + window);
}

// Keys [*lo, *hi) that queries qa..qb (inclusive) of a sequence of `len` can
// see.
// With sinks the range starts at 0 (the keys between the sinks and the
// window are masked by Visible).
__device__ __forceinline__ void KeyRange(int qa, int qb, int len, bool causal, int window, int sinks, int* lo,
                                         int* hi) {
  if (causal) {
    *hi = min(qb + 1, len);
  } else {
    *hi = window > 0 ? min(len, qb + window) : len;
  }
  *lo = window > 0 && !(causal && sinks > 0) ? max(0, qa - window + 1) : 0;
}

// Queries [*lo, *hi) that can see some key in ka..kb (inclusive).
// A sink key (ka < sinks) is seen by every later query.
__device__ __forceinline__ void QueryRange(int ka, int kb, int len, bool causal, int window, int sinks, int* lo,
                                           int* hi) {
  if (causal) {
    *lo = ka;
  } else {
    *lo = window > 0 ? max(0, ka - window + 1) : 0;
  }
  *hi = window > 0 && !(causal && ka < sinks) ? min(len, kb + window) : len;
}

// Maps a flat block index to (sequence, tile) where sequence s has
// ceil(len_s / tile) tiles. False for the surplus blocks of the launch
// (grid = ceil(T / tile) + num_seqs is an upper bound on the tile count).
__device__ __forceinline__ bool FindTile(const int32_t* __restrict__ cu, int num_seqs, int tile, int block, int* seq,
                                         int* index) {
  int acc = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int len = cu[s + 1] - cu[s];
    const int n = (len + tile - 1) / tile;
    if (block < acc + n) {
      *seq = s;
      *index = block - acc;
      return true;
    }
    acc += n;
  }
  return false;
}

// Tile shapes per head-dim bound, shared by the launchers and the CPU
// emulation test: calls f.template operator()<kMaxD, kBr, kBc>() and returns
// true, or returns false when head_dim > 256.
template <class F>
bool DispatchAttnTiles(int head_dim, F&& f) {
  if (head_dim <= 32) {
    f.template operator()<32, 64, 64>();
  } else if (head_dim <= 64) {
    f.template operator()<64, 64, 64>();
  } else if (head_dim <= 128) {
    f.template operator()<128, 64, 64>();
  } else if (head_dim <= 256) {
    f.template operator()<256, 32, 32>();
  } else {
    return false;
  }
  return true;
}

// Blocks along x for `tile`-row tiles of a packed batch: an upper bound on
// sum_s ceil(len_s / tile), surplus blocks exit (FindTile).
inline unsigned TileGridX(int t, int num_seqs, int tile) {
  return static_cast<unsigned>((t + tile - 1) / tile + num_seqs);
}

}  // namespace tandem::kernels::cuda
