// Fast CPU top-k block-sparse decode attention and key block summaries:
// OpenMP over (batch row, head) and (batch row, block); the block choice is
// the reference's (ref/sparse_decode_ref.h, scores in double), the attention
// over the chosen rows is float with SIMD-friendly loops. Same contract as
// Ops::key_block_summaries / sparse_decode_attention.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                         const int32_t* cache_len, int block_size, int first_block, float* summaries);
void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                             const float* k_cache, const float* v_cache, int cache_capacity, const int32_t* cache_len,
                             const float* summaries, float* out);

}  // namespace tandem::kernels::cpu
