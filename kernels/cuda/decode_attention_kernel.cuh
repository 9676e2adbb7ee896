// Device code of decode attention over a KV cache (see
// decode_attention_cuda.cu). Kept in a header, apart from the host launch
// code, so the CPU emulation test (kernels/cuda/emu/) can run it without a GPU.
#pragma once

#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/warp_softmax.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kDecodeWarps = 8;

struct DecodeArgs {
  const float* q;
  const float* k_cache;
  const float* v_cache;
  const int32_t* cache_len;
  float* out;
  int n_new;
  int cache_capacity;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int window;
  int sinks;  // attention sinks (causal, windowed): keys j < sinks stay visible
  float scale;
};

template <int kMaxD>
__global__ void __launch_bounds__(kDecodeWarps* kWarp) DecodeKernel(const DecodeArgs a) {
  constexpr int kE = kMaxD / kWarp;  // values per lane
  __shared__ float part_m[kDecodeWarps];
  __shared__ float part_l[kDecodeWarps];
  __shared__ float part_acc[kDecodeWarps][kMaxD];

  const int h = blockIdx.x;
  const int i = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const size_t qrow = (static_cast<size_t>(b) * a.n_new + i) * a.num_heads + h;
  const float* qp = a.q + qrow * d;

  float qv[kE], acc[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int col = lane + kWarp * e;
    qv[e] = col < d ? qp[col] : 0.f;
    acc[e] = 0.f;
  }
  const int len = a.cache_len[b];
  const int pos = len - a.n_new + i;
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int hi = min(pos, a.cache_capacity - 1);  // inclusive
  // Positions [0, sink_hi) then [lo, hi], numbered 0.. without the gap.
  const int sink_hi = a.window > 0 ? min(a.sinks, lo) : 0;
  const size_t kv_stride = static_cast<size_t>(a.num_kv_heads) * d;
  const size_t base = static_cast<size_t>(b) * a.cache_capacity * kv_stride + static_cast<size_t>(hk) * d;
  float m = -INFINITY, l = 0.f;
  for (int x = warp; x <= sink_hi + hi - lo; x += kDecodeWarps) {
    const int j = x < sink_hi ? x : lo + x - sink_hi;
    const size_t row = base + static_cast<size_t>(j) * kv_stride;
    WarpSoftmaxStep(qv, a.k_cache + row, a.v_cache + row, d, a.scale, lane, m, l, acc);
  }
  MergeWarps<kDecodeWarps, kMaxD>(m, l, acc, part_m, part_l, part_acc, d, a.out + qrow * d);
}

// Head-dim bound per launch, shared by the launcher and the CPU emulation
// test: calls f.template operator()<kMaxD>(); false when head_dim > 256.
template <class F>
bool DispatchDecode(int head_dim, F&& f) {
  if (head_dim <= 32) {
    f.template operator()<32>();
  } else if (head_dim <= 64) {
    f.template operator()<64>();
  } else if (head_dim <= 128) {
    f.template operator()<128>();
  } else if (head_dim <= 256) {
    f.template operator()<256>();
  } else {
    return false;
  }
  return true;
}

}  // namespace
}  // namespace tandem::kernels::cuda
