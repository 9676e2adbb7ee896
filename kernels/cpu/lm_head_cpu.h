// Fast CPU fused LM head + log-softmax (per-token log-probabilities and
// entropy) and its backward, chunked over tokens so at most chunk_tokens x V
// logits exist (in the caller's `scratch`). Per chunk: OpenBLAS sgemm for the
// logits, then OpenMP over rows for max / log-sum-exp / target / entropy
// (AVX2, Exp8). Backward recomputes the chunk's logits, turns them in place
// into dlogits = dlogp[t] * (onehot(target) - softmax), then
// dh_chunk = dlogits W (sgemm, beta 0) and dW += dlogits^T h_chunk (sgemm,
// beta 1). BLAS calls are never made inside OpenMP regions. Targets outside
// [0, V) mean "no target": logp 0, no gradient.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                              int chunk_tokens, float* scratch, float* logp, float* entropy);
void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t, int c,
                               int v, int chunk_tokens, float* scratch, float* dh, float* dw);

}  // namespace tandem::kernels::cpu
