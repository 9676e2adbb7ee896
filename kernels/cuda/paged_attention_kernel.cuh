// Device code of the paged KV cache ops (see paged_attention_cuda.cu). Kept
// in a header, apart from the host launch code, so the CPU emulation test
// (kernels/cuda/emu/) can run it without a GPU.
#pragma once

#include "kernels/bf16.h"
#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/warp_softmax.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kPagedWarps = 4;

struct PagedArgs {
  const float* q;
  const void* k;
  const void* v;
  const int32_t* block_tables;
  const int32_t* row_seq;
  const int32_t* row_pos;
  float* out;
  int block_size;
  int max_blocks;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int window;
  int sinks;  // attention sinks (causal, windowed): keys j < sinks stay visible
  float scale;
};

// One block per (query head, row); its warps split the visible positions
// round-robin with an online softmax each, merged in shared memory.
template <int kMaxD, class T>
__global__ void __launch_bounds__(kPagedWarps* kWarp) PagedAttentionKernel(const PagedArgs a) {
  constexpr int kE = kMaxD / kWarp;
  __shared__ float part_m[kPagedWarps];
  __shared__ float part_l[kPagedWarps];
  __shared__ float part_acc[kPagedWarps][kMaxD];

  const int h = blockIdx.x;
  const int r = blockIdx.y;
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const size_t qrow = static_cast<size_t>(r) * a.num_heads + h;
  const float* qp = a.q + qrow * d;
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);

  float qv[kE], acc[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int col = lane + kWarp * e;
    qv[e] = col < d ? qp[col] : 0.f;
    acc[e] = 0.f;
  }
  const int pos = a.row_pos[r];
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  // Positions [0, sink_hi) then [lo, pos], numbered 0.. without the gap.
  const int sink_hi = a.window > 0 ? min(a.sinks, lo) : 0;
  const int32_t* table = a.block_tables + static_cast<size_t>(a.row_seq[r]) * a.max_blocks;
  const size_t kv_stride = static_cast<size_t>(a.num_kv_heads) * d;
  float m = -INFINITY, l = 0.f;
  for (int x = warp; x <= sink_hi + pos - lo; x += kPagedWarps) {
    const int j = x < sink_hi ? x : lo + x - sink_hi;
    const size_t slot = static_cast<size_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    const size_t row = slot * kv_stride + static_cast<size_t>(hk) * d;
    WarpSoftmaxStep(qv, kc + row, vc + row, d, a.scale, lane, m, l, acc);
  }
  MergeWarps<kPagedWarps, kMaxD>(m, l, acc, part_m, part_l, part_acc, d, a.out + qrow * d);
}

// One block per row; threads over the kd values of k and v.
template <class T>
__global__ void PagedKvWriteKernel(void* kpool, void* vpool, int kd, const float* k, const float* v,
                                   const int32_t* slots) {
  const int r = blockIdx.x;
  const size_t dst = static_cast<size_t>(slots[r]) * kd;
  const size_t src = static_cast<size_t>(r) * kd;
  T* kc = static_cast<T*>(kpool);
  T* vc = static_cast<T*>(vpool);
  for (int e = threadIdx.x; e < kd; e += blockDim.x) {
    if constexpr (sizeof(T) == 2) {
      kc[dst + e] = Bf16FromFloat(k[src + e]);
      vc[dst + e] = Bf16FromFloat(v[src + e]);
    } else {
      kc[dst + e] = k[src + e];
      vc[dst + e] = v[src + e];
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
