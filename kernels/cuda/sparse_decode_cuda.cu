// Top-k block-sparse attention on CUDA. The paged ops (the rollout engine's
// KV cache) run paged_sparse_kernel.cuh; the contiguous ones are not
// implemented and record an error naming the op (CudaOps::last_error), so a
// caller fails with that message instead of computing something else.
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_attention_kernel.cuh"
#include "kernels/cuda/paged_sparse_kernel.cuh"

namespace tandem::kernels {

void CudaOps::key_block_summaries(const AttentionParams&, int, const float*, int, const int32_t*, int, int, float*) {
  Fail("key_block_summaries", "not implemented on the cuda backend");
}

void CudaOps::sparse_decode_attention(const AttentionParams&, const SparseDecodeParams&, const float*, int,
                                      const float*, const float*, int, const int32_t*, const float*, float*) {
  Fail("sparse_decode_attention", "not implemented on the cuda backend");
}

void CudaOps::paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                                  float* summaries) {
  if (t <= 0) return;
  if (p.num_kv_heads <= 0 || p.head_dim <= 0 || p.num_kv_heads > 65535 || kv.block_size <= 0) {
    return Fail("paged_key_summaries", "bad kv heads, head_dim or page size");
  }
  const int threads = p.head_dim >= 128 ? 128 : ((p.head_dim + 31) / 32) * 32;
  if (kv.dtype == KvDtype::kBF16) {
    cuda::PagedKeySummariesKernel<uint16_t>
        <<<p.num_kv_heads, threads>>>(kv.k, slots, t, kv.block_size, p.num_kv_heads, p.head_dim, summaries);
  } else {
    cuda::PagedKeySummariesKernel<float>
        <<<p.num_kv_heads, threads>>>(kv.k, slots, t, kv.block_size, p.num_kv_heads, p.head_dim, summaries);
  }
  Check(cudaGetLastError(), "paged_key_summaries");
}

void CudaOps::paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                                     const float* summaries, const float* q, const int32_t* row_seq,
                                     const int32_t* row_pos, int t, float* out) {
  if (t <= 0) return;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim <= 0 ||
      p.num_heads > 65535 || t > 65535) {
    return Fail("paged_sparse_attention", "bad heads / head_dim, or more than 65535 rows or heads");
  }
  if (kv.block_size <= 0 || s.block_size < kv.block_size || s.block_size % kv.block_size != 0 || s.recent_blocks < 1) {
    return Fail("paged_sparse_attention", "the sparse block is not whole pages, or no recent block");
  }
  const cuda::PagedSparseArgs a = cuda::MakePagedSparseArgs(p, s, kv, summaries, q, row_seq, row_pos, out);
  const size_t smem = cuda::PagedSparseSmemBytes(a.max_blocks);
  if (smem > 48 * 1024) {
    return Fail("paged_sparse_attention", "more than 4096 sparse blocks per sequence; raise rollout.sparse.block_size");
  }
  const dim3 grid(p.num_heads, t);
  const bool supported = cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() {
    if (kv.dtype == KvDtype::kBF16) {
      cuda::PagedSparseKernel<kMaxD, uint16_t><<<grid, cuda::kSparseThreads, smem>>>(a);
    } else {
      cuda::PagedSparseKernel<kMaxD, float><<<grid, cuda::kSparseThreads, smem>>>(a);
    }
  });
  if (!supported) {
    return Fail("paged_sparse_attention", "head_dim " + std::to_string(p.head_dim) + " > 256 unsupported");
  }
  Check(cudaGetLastError(), "paged_sparse_attention");
}

}  // namespace tandem::kernels
