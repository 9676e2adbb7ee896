// Decode attention over a KV cache: one block per (head, new token, batch
// row); its 8 warps split the visible cache positions round-robin, each warp
// keeps an online softmax (max, sum, accumulator with D/32 values per lane),
// and the block merges the 8 partial results in shared memory at the end.
// New token i of row b sits at position cache_len[b] - n_new + i and sees
// cache positions j <= that position (and > position - window when windowed).
#include <string>

#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_attention_kernel.cuh"

namespace tandem::kernels {
namespace cuda {
namespace {

template <int kMaxD>
cudaError_t LaunchDecode(const DecodeArgs& a, int batch) {
  const dim3 grid(a.num_heads, a.n_new, batch);
  DecodeKernel<kMaxD><<<grid, kDecodeWarps * kWarp>>>(a);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

void CudaOps::decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                               const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) {
  if (batch <= 0 || n_new <= 0) return;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim <= 0) {
    return Fail("decode_attention", "bad heads / head_dim");
  }
  if (batch > 65535 || n_new > 65535) {
    return Fail("decode_attention", "batch or n_new > 65535");
  }
  cuda::DecodeArgs a{q,
                     k_cache,
                     v_cache,
                     cache_len,
                     out,
                     n_new,
                     cache_capacity,
                     p.num_heads,
                     p.num_kv_heads,
                     p.head_dim,
                     p.window,
                     p.sinks,
                     p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.head_dim))};
  cudaError_t err = cudaSuccess;
  const bool supported =
      cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() { err = cuda::LaunchDecode<kMaxD>(a, batch); });
  if (!supported) {
    return Fail("decode_attention", "head_dim " + std::to_string(p.head_dim) + " > 256 unsupported");
  }
  Check(err, "decode_attention");
}

}  // namespace tandem::kernels
