// Top-k block-sparse attention over a paged KV cache: the block bound shared
// by the reference and the fast CPU backend (in double, so both pick the
// same blocks), and the reference ops (plain loops, double accumulators).
// Same contract as Ops::paged_key_summaries / paged_sparse_attention.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/ref/sparse_decode_ref.h"

namespace tandem::kernels::ref {

// Bound of sparse block i (pages [i m, (i + 1) m) of block table `table`)
// on query qv [d] of kv head hk: the pages' summaries [num_blocks, hkv, 2,
// d] combined into one max and min (mx, mn: scratch of d floats each).
inline double PagedBlockBound(const int32_t* table, int pages_per_block, const float* summaries, int hkv, int hk, int d,
                              const float* qv, int i, float* mx, float* mn) {
  for (int j = 0; j < pages_per_block; ++j) {
    const float* sm = summaries + (size_t(table[i * pages_per_block + j]) * hkv + hk) * 2 * d;
    for (int e = 0; e < d; ++e) {
      mx[e] = j == 0 ? sm[e] : std::max(mx[e], sm[e]);
      mn[e] = j == 0 ? sm[d + e] : std::min(mn[e], sm[d + e]);
    }
  }
  return BlockBound(qv, mx, mn, d);
}

void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t, float* summaries);
void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                            const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                            int t, float* out);

}  // namespace tandem::kernels::ref
