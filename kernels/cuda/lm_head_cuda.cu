// Fused LM head + log-softmax, chunked over tokens: per chunk one cuBLAS GEMM
// writes logits [n, V] into the caller's scratch, then one block per row
// computes log-sum-exp, the target's log-probability and the entropy.
// Backward turns the scratch into dlogits in place
// (dlogp * (onehot - softmax)), then dh = dlogits w (overwrite) and
// dw += dlogits^T h (two GEMMs). Targets outside [0, V): logp = 0, no
// gradient (as the reference).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/lm_head_kernel.cuh"

namespace tandem::kernels {

void CudaOps::lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                       int chunk_tokens, float* scratch, float* logp, float* entropy) {
  if (t <= 0) return;
  if (v <= 0 || c <= 0 || chunk_tokens <= 0) {
    return Fail("lm_head_logprobs_forward", "bad shape");
  }
  for (int t0 = 0; t0 < t; t0 += chunk_tokens) {
    const int n = t - t0 < chunk_tokens ? t - t0 : chunk_tokens;
    // scratch[n, V] = h[t0:t0+n] w^T
    matmul(false, true, n, v, c, 1.f, h + static_cast<size_t>(t0) * c, c, w, c, 0.f, scratch, v);
    cuda::LogprobRowKernel<<<n, cuda::kLmThreads>>>(scratch, v, targets + t0, logp + t0,
                                                    entropy != nullptr ? entropy + t0 : nullptr);
    Check(cudaGetLastError(), "lm_head_logprobs_forward");
  }
}

void CudaOps::lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp,
                                        int t, int c, int v, int chunk_tokens, float* scratch, float* dh, float* dw) {
  if (t <= 0) return;
  if (v <= 0 || c <= 0 || chunk_tokens <= 0) {
    return Fail("lm_head_logprobs_backward", "bad shape");
  }
  for (int t0 = 0; t0 < t; t0 += chunk_tokens) {
    const int n = t - t0 < chunk_tokens ? t - t0 : chunk_tokens;
    const float* hc = h + static_cast<size_t>(t0) * c;
    matmul(false, true, n, v, c, 1.f, hc, c, w, c, 0.f, scratch, v);
    cuda::DlogitsRowKernel<<<n, cuda::kLmThreads>>>(scratch, v, targets + t0, dlogp + t0);
    Check(cudaGetLastError(), "lm_head_logprobs_backward");
    // dh[n, C] = dlogits[n, V] w[V, C]
    matmul(false, false, n, c, v, 1.f, scratch, v, w, c, 0.f, dh + static_cast<size_t>(t0) * c, c);
    // dw[V, C] += dlogits^T[V, n] h[n, C]
    matmul(true, false, v, c, n, 1.f, scratch, v, hc, c, 1.f, dw, c);
  }
}

}  // namespace tandem::kernels
