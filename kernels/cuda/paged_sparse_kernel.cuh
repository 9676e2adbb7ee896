// Device code of the paged top-k block-sparse ops (see paged_sparse_cuda.cu).
// Kept in a header, apart from the host launch code, so the CPU emulation
// (kernels/cuda/emu/) runs it against the reference without a GPU.
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/paged_attention_kernel.cuh"

namespace tandem::kernels::cuda {
namespace {

constexpr int kSparseWarps = 4;
constexpr int kSparseThreads = kSparseWarps * kWarp;

struct PagedSparseArgs {
  const float* q;
  const void* k;
  const void* v;
  const float* summaries;  // [num_pages, Hkv, 2, D]
  const int32_t* block_tables;
  const int32_t* row_seq;
  const int32_t* row_pos;
  float* out;
  int page_size;  // rows per KV cache page
  int max_pages;  // block-table row length
  int num_heads;
  int num_kv_heads;
  int head_dim;
  float scale;
  int block_size;  // rows per sparse block (whole pages)
  int top_k, sink_blocks, recent_blocks;
  int max_blocks;  // sparse blocks a sequence can have: the shared arrays' length
};

// The kernel arguments of one call (CudaOps and the emulator).
inline PagedSparseArgs MakePagedSparseArgs(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                                           const float* summaries, const float* q, const int32_t* row_seq,
                                           const int32_t* row_pos, float* out) {
  const int m = kv.block_size > 0 && s.block_size >= kv.block_size ? s.block_size / kv.block_size : 1;
  return PagedSparseArgs{q,
                         kv.k,
                         kv.v,
                         summaries,
                         kv.block_tables,
                         row_seq,
                         row_pos,
                         out,
                         kv.block_size,
                         kv.max_blocks,
                         p.num_heads,
                         p.num_kv_heads,
                         p.head_dim,
                         p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.head_dim)),
                         s.block_size,
                         s.top_k_blocks,
                         s.sink_blocks,
                         s.recent_blocks,
                         (kv.max_blocks + m - 1) / m};
}

// Dynamic shared memory of PagedSparseKernel for `max_blocks` blocks: the
// candidates' bounds (double) and a chosen flag per block (int).
inline size_t PagedSparseSmemBytes(int max_blocks) {
  return static_cast<size_t>(max_blocks) * (sizeof(double) + sizeof(int));
}

// A product rounded once (no fused multiply-add), as the host computes it.
__device__ __forceinline__ double SparseMul(double a, double b) {
#if defined(TANDEM_CUDA_EMULATION)
  return a * b;
#else
  return __dmul_rn(a, b);
#endif
}

// One block per (kv head); its threads over the head dim, rows in order:
// the page of each row that ends a run on its page is recomputed from its
// rows 0..offset.
template <class T>
__global__ void PagedKeySummariesKernel(const void* kpool, const int32_t* slots, int t, int page_size, int hkv, int d,
                                        float* summaries) {
  const int h = blockIdx.x;
  const T* kc = static_cast<const T*>(kpool);
  const size_t kd = static_cast<size_t>(hkv) * d;
  for (int r = 0; r < t; ++r) {
    const int page = slots[r] / page_size, off = slots[r] % page_size;
    if (r + 1 < t && slots[r + 1] / page_size == page && slots[r + 1] % page_size > off) continue;
    float* mx = summaries + (static_cast<size_t>(page) * hkv + h) * 2 * d;
    float* mn = mx + d;
    const size_t base = static_cast<size_t>(page) * page_size;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
      float a = KvLoad(kc, base * kd + static_cast<size_t>(h) * d + e), b = a;
      for (int j = 1; j <= off; ++j) {
        const float x = KvLoad(kc, (base + j) * kd + static_cast<size_t>(h) * d + e);
        a = fmaxf(a, x);
        b = fminf(b, x);
      }
      mx[e] = a;
      mn[e] = b;
    }
  }
}

// One block per (query head, row). Its threads bound the candidate blocks
// (one block each, pages combined, the sum over the head dim in order and in
// double: the host's rule and rounding), choose the top k one at a time
// (largest bound, lowest block on ties), then its warps split the chosen
// positions round-robin with an online softmax each, merged in shared
// memory.
template <int kMaxD, class T>
__global__ void __launch_bounds__(kSparseThreads) PagedSparseKernel(const PagedSparseArgs a) {
  constexpr int kE = kMaxD / kWarp;
  __shared__ float part_m[kSparseWarps];
  __shared__ float part_l[kSparseWarps];
  __shared__ float part_acc[kSparseWarps][kMaxD];
  __shared__ double red_v[kSparseThreads];
  __shared__ int red_i[kSparseThreads];
  TANDEM_DYNAMIC_SMEM(smem);
  double* bound = reinterpret_cast<double*>(smem);
  int* chosen = reinterpret_cast<int*>(bound + a.max_blocks);

  const int h = blockIdx.x;
  const int r = blockIdx.y;
  const int tid = threadIdx.x;
  const int hk = h / (a.num_heads / a.num_kv_heads);
  const int d = a.head_dim;
  const int lane = tid % kWarp;
  const int warp = tid / kWarp;
  const size_t qrow = static_cast<size_t>(r) * a.num_heads + h;
  const float* qp = a.q + qrow * d;
  const int pos = a.row_pos[r];
  const int32_t* table = a.block_tables + static_cast<size_t>(a.row_seq[r]) * a.max_pages;
  const int m = a.block_size / a.page_size;
  const int nblk = pos / a.block_size + 1;
  const int sink_end = min(nblk, max(0, a.sink_blocks));
  const int recent_begin = max(sink_end, nblk - max(0, a.recent_blocks));

  for (int i = tid; i < nblk; i += blockDim.x) {
    const bool candidate = i >= sink_end && i < recent_begin;
    chosen[i] = candidate ? 0 : 1;
    if (!candidate) continue;
    double s = 0;
    for (int e = 0; e < d; ++e) {
      float mx = 0.f, mn = 0.f;
      for (int j = 0; j < m; ++j) {
        const float* sm = a.summaries + (static_cast<size_t>(table[i * m + j]) * a.num_kv_heads + hk) * 2 * d;
        mx = j == 0 ? sm[e] : fmaxf(mx, sm[e]);
        mn = j == 0 ? sm[d + e] : fminf(mn, sm[d + e]);
      }
      const double qe = qp[e];
      s += fmax(SparseMul(qe, mx), SparseMul(qe, mn));
    }
    bound[i] = s;
  }
  __syncthreads();
  const int k = min(max(0, a.top_k), recent_begin - sink_end);
  for (int round = 0; round < k; ++round) {
    double best = -INFINITY;
    int arg = nblk;
    for (int i = sink_end + tid; i < recent_begin; i += blockDim.x) {
      if (!chosen[i] && (bound[i] > best || (bound[i] == best && i < arg))) {
        best = bound[i];
        arg = i;
      }
    }
    red_v[tid] = best;
    red_i[tid] = arg;
    __syncthreads();
    for (int stride = kSparseThreads / 2; stride > 0; stride >>= 1) {
      if (tid < stride) {
        const double v2 = red_v[tid + stride];
        const int i2 = red_i[tid + stride];
        if (v2 > red_v[tid] || (v2 == red_v[tid] && i2 < red_i[tid])) {
          red_v[tid] = v2;
          red_i[tid] = i2;
        }
      }
      __syncthreads();
    }
    if (tid == 0 && red_i[0] < nblk) chosen[red_i[0]] = 1;
    __syncthreads();
  }

  float qv[kE], acc[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) {
    const int col = lane + kWarp * e;
    qv[e] = col < d ? qp[col] : 0.f;
    acc[e] = 0.f;
  }
  const T* kc = static_cast<const T*>(a.k);
  const T* vc = static_cast<const T*>(a.v);
  const size_t kv_stride = static_cast<size_t>(a.num_kv_heads) * d;
  float mrun = -INFINITY, l = 0.f;
  for (int i = 0; i < nblk; ++i) {
    if (!chosen[i]) continue;
    const int end = min(pos + 1, (i + 1) * a.block_size);
    for (int j = i * a.block_size + warp; j < end; j += kSparseWarps) {
      const size_t slot = static_cast<size_t>(table[j / a.page_size]) * a.page_size + j % a.page_size;
      const size_t row = slot * kv_stride + static_cast<size_t>(hk) * d;
      WarpSoftmaxStep(qv, kc + row, vc + row, d, a.scale, lane, mrun, l, acc);
    }
  }
  MergeWarps<kSparseWarps, kMaxD>(mrun, l, acc, part_m, part_l, part_acc, d, a.out + qrow * d);
}

}  // namespace
}  // namespace tandem::kernels::cuda
