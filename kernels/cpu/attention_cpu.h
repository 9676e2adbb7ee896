// Fast CPU attention: FlashAttention-2 style tiling with online softmax,
// OpenMP over (sequence, head, query tile), SIMD inner loops, O(T) memory
// (per-thread tile scratch only, never a T x T matrix). Same contract as
// Ops::attention_* in kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse);
void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                        const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t, float* dq,
                        float* dk, float* dv);
void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                      const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out);

}  // namespace tandem::kernels::cpu
