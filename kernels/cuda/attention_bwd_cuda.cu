// FlashAttention-2 style backward on CUDA cores (fp32). Probabilities are
// recomputed from q, k and the saved lse; nothing of size T x T is stored.
//  1. Delta[t, h] = rowsum(dout * out) into the CudaOps workspace.
//  2. One block per (key tile, kv head) of each sequence: K/V tile in shared
//     memory, loop over the query heads of the GQA group and over the query
//     tiles that can see the key tile; dK and dV accumulate in registers
//     (written once, no atomics); dQ contributions go to global memory with
//     atomicAdd (dq zeroed first).
#include <string>

#include "kernels/cuda/attention_bwd_kernel.cuh"
#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

template <int kMaxD, int kBr, int kBc>
cudaError_t LaunchBwd(const AttnBwdArgs& a, int t) {
  constexpr size_t smem = BwdSmemBytes<kMaxD, kBr, kBc>();
  auto kernel = AttnBwdKernel<kMaxD, kBr, kBc>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(TileGridX(t, a.num_seqs, kBc), a.num_kv_heads);
  kernel<<<grid, kAttnThreads, smem>>>(a);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

void CudaOps::attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* out, const float* dout, const float* lse, const int32_t* cu_seqlens,
                                 int num_seqs, int t, float* dq, float* dk, float* dv) {
  if (t <= 0 || num_seqs <= 0) return;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim <= 0) {
    return Fail("attention_backward", "bad heads / head_dim");
  }
  if (p.head_dim > 256) {
    return Fail("attention_backward", "head_dim " + std::to_string(p.head_dim) + " > 256 unsupported");
  }
  const size_t rows = static_cast<size_t>(t) * p.num_heads;
  float* delta = Workspace(rows);
  if (delta == nullptr) return;
  const size_t q_bytes = rows * p.head_dim * sizeof(float);
  const size_t kv_bytes = static_cast<size_t>(t) * p.num_kv_heads * p.head_dim * sizeof(float);
  // dq accumulates atomically; dk/dv zeroed so rows outside cu_seqlens'
  // range (if any) are defined.
  if (!Check(cudaMemsetAsync(dq, 0, q_bytes, 0), "attention_backward dq") ||
      !Check(cudaMemsetAsync(dk, 0, kv_bytes, 0), "attention_backward dk") ||
      !Check(cudaMemsetAsync(dv, 0, kv_bytes, 0), "attention_backward dv")) {
    return;
  }
  cuda::AttnDeltaKernel<<<cuda::GridFor(rows * cuda::kWarp, 256, 65535u * 4u), 256>>>(out, dout, rows, p.head_dim,
                                                                                      delta);
  if (!Check(cudaGetLastError(), "attention_backward delta")) return;

  const cuda::AttnBwdArgs a = cuda::BwdArgsOf(p, q, k, v, dout, lse, delta, dq, dk, dv, cu_seqlens, num_seqs);
  cudaError_t err = cudaSuccess;
  cuda::DispatchAttnTiles(p.head_dim,
                          [&]<int kMaxD, int kBr, int kBc>() { err = cuda::LaunchBwd<kMaxD, kBr, kBc>(a, t); });
  Check(err, "attention_backward");
}

}  // namespace tandem::kernels
