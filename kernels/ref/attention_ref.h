// Reference attention (plain loops, double accumulators, materialises one
// score row at a time). Same contract as Ops::attention_* in kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse);
void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                        const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t, float* dq,
                        float* dk, float* dv);
void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                      const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out);

}  // namespace tandem::kernels::ref
