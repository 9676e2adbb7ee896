// Reference paged KV cache ops (plain loops, double accumulators, one score
// row materialised at a time). Same contract as Ops::paged_kv_write and
// Ops::paged_attention in kernels/ops.h.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t);
void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                     const int32_t* row_pos, int t, float* out);

// Value of element e (0 <= e < kd) of cache slot `slot` of a pool.
float PagedLoad(const void* pool, KvDtype dtype, int64_t slot, int kd, int e);

}  // namespace tandem::kernels::ref
