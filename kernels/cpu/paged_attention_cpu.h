// Fast CPU paged KV cache ops (Ops::paged_kv_write, Ops::paged_attention in
// kernels/ops.h). Attention runs one task per (row, kv head), all query
// heads of the kv head together, block by block with an online softmax;
// bf16 blocks are widened once per block into a stack buffer; the softmax
// weights use the AVX2 exp of simd_math.h. Head widths 32, 64 and 128 run a
// compile-time-width path (query and output accumulator in registers, four
// keys per horizontal reduction); other widths a generic loop. Shapes past
// the stack buffers (head_dim > 256, more than 32 query heads per kv head,
// blocks over 64 rows) go to the reference.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t);
void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                     const int32_t* row_pos, int t, float* out);

}  // namespace tandem::kernels::cpu
