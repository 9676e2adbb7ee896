// Fast CPU top-k block-sparse attention over a paged KV cache
// (Ops::paged_key_summaries, Ops::paged_sparse_attention in kernels/ops.h).
// Summaries: kv heads in parallel, each page recomputed from its rows up to
// the offset written (skipped when the next row continues the page).
// Attention: one task per (row, kv head); the candidate blocks' pages are
// combined once for all query heads of the kv head, each query head picks
// its blocks by the reference's rule (ref::SelectBlocksBy, bounds in double
// from the same combined max / min as ref::PagedBlockBound, so both pick
// the same blocks), then an online softmax page by page over the chosen
// positions, bf16 pages widened into a stack buffer. Shapes past the stack
// buffers (head_dim > 256, pages over 64 rows) go to the reference.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace tandem::kernels::cpu {

void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t, float* summaries);
void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                            const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                            int t, float* out);

}  // namespace tandem::kernels::cpu
