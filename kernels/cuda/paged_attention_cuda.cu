// Paged KV cache ops on CUDA: the k/v write (one block per row, rounding to
// bf16 for bf16 pools) and attention over block tables (one block per
// (query head, row); see paged_attention_kernel.cuh).
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_attention_kernel.cuh"
#include "kernels/cuda/paged_attention_kernel.cuh"

namespace tandem::kernels {

void CudaOps::paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) {
  if (t <= 0 || kd <= 0) return;
  if (t > 2147483647 / 2) return Fail("paged_kv_write", "too many rows");
  const int threads = kd >= 256 ? 256 : ((kd + 31) / 32) * 32;
  if (kv.dtype == KvDtype::kBF16) {
    cuda::PagedKvWriteKernel<uint16_t><<<t, threads>>>(kv.k, kv.v, kd, k, v, slots);
  } else {
    cuda::PagedKvWriteKernel<float><<<t, threads>>>(kv.k, kv.v, kd, k, v, slots);
  }
  Check(cudaGetLastError(), "paged_kv_write");
}

void CudaOps::paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                              const int32_t* row_pos, int t, float* out) {
  if (t <= 0) return;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim <= 0 ||
      p.num_heads > 65535 || t > 65535) {
    return Fail("paged_attention", "bad heads / head_dim, or more than 65535 rows or heads");
  }
  const cuda::PagedArgs a{q,
                          kv.k,
                          kv.v,
                          kv.block_tables,
                          row_seq,
                          row_pos,
                          out,
                          kv.block_size,
                          kv.max_blocks,
                          p.num_heads,
                          p.num_kv_heads,
                          p.head_dim,
                          p.window,
                          p.sinks,
                          p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.head_dim))};
  const dim3 grid(p.num_heads, t);
  const bool supported = cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() {
    if (kv.dtype == KvDtype::kBF16) {
      cuda::PagedAttentionKernel<kMaxD, uint16_t><<<grid, cuda::kPagedWarps * cuda::kWarp>>>(a);
    } else {
      cuda::PagedAttentionKernel<kMaxD, float><<<grid, cuda::kPagedWarps * cuda::kWarp>>>(a);
    }
  });
  if (!supported) {
    return Fail("paged_attention", "head_dim " + std::to_string(p.head_dim) + " > 256 unsupported");
  }
  Check(cudaGetLastError(), "paged_attention");
}

}  // namespace tandem::kernels
