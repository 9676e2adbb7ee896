// Device helpers shared by the decode-style attention kernels (decode,
// paged, paged sparse): each warp of a block runs an online softmax over
// its share of the key/value rows for one query, and the warps' partial
// results merge in shared memory. Header-only, for the kernel headers.
#pragma once

#include "kernels/bf16.h"
#include "kernels/cuda/cuda_common.cuh"

namespace tandem::kernels::cuda {
namespace {

__device__ __forceinline__ float KvLoad(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float KvLoad(const uint16_t* p, size_t i) { return FloatFromBf16(p[i]); }

// One key/value row (k, v: the row's head_dim values) into a warp's running
// max m, sum l and accumulator acc; lane holds columns lane + 32 e of the
// query qv and of acc.
template <int kE, class T>
__device__ __forceinline__ void WarpSoftmaxStep(const float (&qv)[kE], const T* k, const T* v, int d, float scale,
                                                int lane, float& m, float& l, float (&acc)[kE]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int col = lane + kWarp * e;
    if (col < d) s = fmaf(qv[e], KvLoad(k, col), s);
  }
  s = WarpSum(s) * scale;
  const float m_new = fmaxf(m, s);
  const float alpha = expf(m - m_new);
  const float p = expf(s - m_new);
  l = l * alpha + p;
  m = m_new;
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int col = lane + kWarp * e;
    acc[e] = acc[e] * alpha + (col < d ? p * KvLoad(v, col) : 0.f);
  }
}

// Merges the kWarps warps' (m, l, acc) into out [d] through the shared
// part_m, part_l [kWarps] and part_acc [kWarps][kMaxD]. Every thread of the
// block calls it (it holds a barrier).
template <int kWarps, int kMaxD>
__device__ __forceinline__ void MergeWarps(float m, float l, const float (&acc)[kMaxD / kWarp], float* part_m,
                                           float* part_l, float (*part_acc)[kMaxD], int d, float* out) {
  constexpr int kE = kMaxD / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) part_acc[warp][lane + kWarp * e] = acc[e];
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, part_m[w]);
  float total = 0.f;
  float wgt[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = part_m[w] == -INFINITY ? 0.f : expf(part_m[w] - mx);
    total += part_l[w] * wgt[w];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  for (int col = threadIdx.x; col < d; col += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += part_acc[w][col] * wgt[w];
    out[col] = o * inv;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
