// FlashAttention-2 style forward on CUDA cores (fp32): one block per
// (query tile, head) of each packed sequence; the Q tile, one K/V tile and the
// probability tile live in shared memory; online softmax keeps each row's
// running max and sum in registers; only out and lse [T, H] are written.
// GQA (query head h reads kv head h / (H / Hkv)), varlen via cu_seqlens,
// causal or not, optional sliding window. Head dims up to 256 (templated on
// an upper bound, the runtime head_dim masks the rest).
#include <string>

#include "kernels/cuda/attention_cuda.cuh"
#include "kernels/cuda/attention_fwd_kernel.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {
namespace cuda {
namespace {

template <int kMaxD, int kBr, int kBc>
cudaError_t LaunchFwd(const AttnFwdArgs& a, int t) {
  constexpr size_t smem = FwdSmemBytes<kMaxD, kBr, kBc>();
  auto kernel = AttnFwdKernel<kMaxD, kBr, kBc>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(TileGridX(t, a.num_seqs, kBr), a.num_heads);
  kernel<<<grid, kAttnThreads, smem>>>(a);
  return cudaGetLastError();
}

}  // namespace
}  // namespace cuda

void CudaOps::attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) {
  if (t <= 0 || num_seqs <= 0) return;
  if (p.num_heads <= 0 || p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.head_dim <= 0) {
    return Fail("attention_forward", "bad heads / head_dim");
  }
  if (p.num_heads > 65535) return Fail("attention_forward", "too many heads");
  const cuda::AttnFwdArgs a = cuda::FwdArgsOf(p, q, k, v, out, lse, cu_seqlens, num_seqs);
  cudaError_t err = cudaSuccess;
  const bool supported = cuda::DispatchAttnTiles(
      p.head_dim, [&]<int kMaxD, int kBr, int kBc>() { err = cuda::LaunchFwd<kMaxD, kBr, kBc>(a, t); });
  if (!supported) {
    return Fail("attention_forward", "head_dim " + std::to_string(p.head_dim) + " > 256 unsupported");
  }
  Check(err, "attention_forward");
}

}  // namespace tandem::kernels
