// Device code of the FlashAttention-2 style forward (launched from
// attention_fwd_cuda.cu). Kept apart from the host code so the CPU emulation
// test (kernels/cuda/emu/) runs the very same kernel without a GPU.
#pragma once

#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

template <int kMaxD, int kBr, int kBc>
constexpr size_t FwdSmemBytes() {
  return sizeof(float) * (static_cast<size_t>(kBr + 2 * kBc) * (kMaxD + 1) + kBr * (kBc + 1));
}

template <int kMaxD, int kBr, int kBc>
__global__ void __launch_bounds__(kAttnThreads) AttnFwdKernel(const AttnFwdArgs a) {
  constexpr int kRi = kBr / 16;
  constexpr int kCj = kBc / 16;
  constexpr int kDj = kMaxD / 16;
  constexpr int kLd = kMaxD + 1;  // padded rows: conflict-free column reads
  constexpr int kLp = kBc + 1;
  TANDEM_DYNAMIC_SMEM(smem);
  float* qs = smem;
  float* ks = qs + kBr * kLd;
  float* vs = ks + kBc * kLd;
  float* ps = vs + kBc * kLd;

  int seq, tile;
  if (!FindTile(a.cu_seqlens, a.num_seqs, kBr, blockIdx.x, &seq, &tile)) return;
  const int start = a.cu_seqlens[seq];
  const int len = a.cu_seqlens[seq + 1] - start;
  const int q0 = tile * kBr;
  // A tile of key-only rows: the whole block leaves.
  if (seq == 0 && min(q0 + kBr, len) <= a.skip_query_rows) return;
  const int h = blockIdx.y;
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const int tid = threadIdx.x;
  const int tx = tid & 15;
  const int ty = tid >> 4;
  const size_t q_stride = static_cast<size_t>(a.num_heads) * d;
  const size_t kv_stride = static_cast<size_t>(a.num_kv_heads) * d;
  const float* qbase = a.q + static_cast<size_t>(start) * q_stride + static_cast<size_t>(h) * d;
  const float* kbase = a.k + static_cast<size_t>(start) * kv_stride + static_cast<size_t>(hk) * d;
  const float* vbase = a.v + static_cast<size_t>(start) * kv_stride + static_cast<size_t>(hk) * d;

  for (int idx = tid; idx < kBr * d; idx += kAttnThreads) {
    const int r = idx / d;
    const int c = idx - r * d;
    const int row = q0 + r;
    qs[r * kLd + c] = row < len ? qbase[row * q_stride + c] : 0.f;
  }

  float m[kRi], l[kRi], acc[kRi][kDj];
#pragma unroll
  for (int i = 0; i < kRi; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < kDj; ++j) acc[i][j] = 0.f;
  }

  int kv_lo, kv_hi;
  KeyRange(q0, min(q0 + kBr, len) - 1, len, a.causal, a.window, a.sinks, &kv_lo, &kv_hi);
  // With sinks, the key tiles between the sinks and the earliest window of
  // the tile's queries hold no visible key: skip them (the whole block
  // does, so the barriers stay matched), keeping the work bounded by the
  // sinks and the window.
  const bool gapped = a.causal && a.window > 0 && a.sinks > 0;
  const int gap_end = gapped ? (max(0, q0 - a.window + 1) / kBc) * kBc : 0;
  for (int kb = (kv_lo / kBc) * kBc; kb < kv_hi; kb += kBc) {
    if (kb >= a.sinks && kb < gap_end) {
      kb = gap_end - kBc;
      continue;
    }
    __syncthreads();  // previous tile fully consumed (and Q written)
    for (int idx = tid; idx < kBc * d; idx += kAttnThreads) {
      const int r = idx / d;
      const int c = idx - r * d;
      const int row = kb + r;
      const bool in = row < len;
      ks[r * kLd + c] = in ? kbase[row * kv_stride + c] : 0.f;
      vs[r * kLd + c] = in ? vbase[row * kv_stride + c] : 0.f;
    }
    __syncthreads();

    float s[kRi][kCj];
#pragma unroll
    for (int i = 0; i < kRi; ++i)
#pragma unroll
      for (int j = 0; j < kCj; ++j) s[i][j] = 0.f;
    for (int dd = 0; dd < d; ++dd) {
      float qv[kRi], kv[kCj];
#pragma unroll
      for (int i = 0; i < kRi; ++i) qv[i] = qs[(ty + 16 * i) * kLd + dd];
#pragma unroll
      for (int j = 0; j < kCj; ++j) kv[j] = ks[(tx + 16 * j) * kLd + dd];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kCj; ++j) s[i][j] = fmaf(qv[i], kv[j], s[i][j]);
    }

#pragma unroll
    for (int i = 0; i < kRi; ++i) {
      const int qi = q0 + ty + 16 * i;
      float rmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCj; ++j) {
        const int kj = kb + tx + 16 * j;
        const bool vis = qi < len && kj < len && Visible(qi, kj, a.causal, a.window, a.sinks);
        s[i][j] = vis ? s[i][j] * a.scale : -INFINITY;
        rmax = fmaxf(rmax, s[i][j]);
      }
      // The 16 threads of a row are lanes of one half-warp.
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, o));
      const float m_new = fmaxf(m[i], rmax);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = expf(m[i] - m_use);
      float rsum = 0.f;
#pragma unroll
      for (int j = 0; j < kCj; ++j) {
        const float p = expf(s[i][j] - m_use);
        ps[(ty + 16 * i) * kLp + tx + 16 * j] = p;
        rsum += p;
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) rsum += __shfl_xor_sync(0xffffffffu, rsum, o);
      l[i] = l[i] * alpha + rsum;
      m[i] = m_new;
#pragma unroll
      for (int j = 0; j < kDj; ++j) acc[i][j] *= alpha;
    }
    __syncthreads();

    for (int c = 0; c < kBc; ++c) {
      float pv[kRi], vv[kDj];
#pragma unroll
      for (int i = 0; i < kRi; ++i) pv[i] = ps[(ty + 16 * i) * kLp + c];
#pragma unroll
      for (int j = 0; j < kDj; ++j) vv[j] = vs[c * kLd + tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kDj; ++j) acc[i][j] = fmaf(pv[i], vv[j], acc[i][j]);
    }
  }

#pragma unroll
  for (int i = 0; i < kRi; ++i) {
    const int qi = q0 + ty + 16 * i;
    if (qi >= len) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    float* orow = a.out + static_cast<size_t>(start + qi) * q_stride + static_cast<size_t>(h) * d;
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      const int col = tx + 16 * j;
      if (col < d) orow[col] = acc[i][j] * inv;
    }
    if (tx == 0) {
      a.lse[static_cast<size_t>(start + qi) * a.num_heads + h] = l[i] > 0.f ? m[i] + logf(l[i]) : -INFINITY;
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
