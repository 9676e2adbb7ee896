// Top-k block-sparse decode attention: the block selection rule shared by
// the reference and the fast CPU backend (scores in double, so both pick the
// same blocks), and the reference op (plain loops, double accumulators).
// Same contract as Ops::key_block_summaries / sparse_decode_attention.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace tandem::kernels::ref {

// Blocks (ascending) of a cache of nblk blocks that a query attends: the
// sink blocks, the recent blocks and the top_k_blocks others with the
// largest bound(i) (a double; ties: lower block first).
template <typename Bound>
void SelectBlocksBy(const SparseDecodeParams& s, int nblk, Bound bound, std::vector<std::pair<double, int>>* scratch,
                    std::vector<int>* blocks) {
  blocks->clear();
  const int sink_end = std::min(nblk, std::max(0, s.sink_blocks));
  const int recent_begin = std::max(sink_end, nblk - std::max(0, s.recent_blocks));
  scratch->clear();
  for (int i = sink_end; i < recent_begin; ++i) scratch->emplace_back(-bound(i), i);
  const size_t k = std::min(scratch->size(), size_t(std::max(0, s.top_k_blocks)));
  std::partial_sort(scratch->begin(), scratch->begin() + k, scratch->end());
  for (int i = 0; i < sink_end; ++i) blocks->push_back(i);
  for (size_t i = 0; i < k; ++i) blocks->push_back((*scratch)[i].second);
  for (int i = recent_begin; i < nblk; ++i) blocks->push_back(i);
  std::sort(blocks->begin(), blocks->end());
}

// The bound of a block on query qv [d]: sum_e max(q_e max_e, q_e min_e).
inline double BlockBound(const float* qv, const float* mx, const float* mn, int d) {
  double score = 0;
  for (int e = 0; e < d; ++e) score += std::max(double(qv[e]) * mx[e], double(qv[e]) * mn[e]);
  return score;
}

// Blocks (ascending) that query row qv [D] of kv head hk attends in a cache
// of `len` rows; summaries of this batch row [nblk_cap, Hkv, 2, D].
inline void SelectBlocks(const SparseDecodeParams& s, int len, int hkv, int hk, int d, const float* qv,
                         const float* summaries, std::vector<std::pair<double, int>>* scratch,
                         std::vector<int>* blocks) {
  const int nblk = (len + s.block_size - 1) / s.block_size;
  SelectBlocksBy(
      s, nblk,
      [&](int i) {
        const float* mx = summaries + (size_t(i) * hkv + hk) * 2 * d;
        return BlockBound(qv, mx, mx + d, d);
      },
      scratch, blocks);
}

void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                         const int32_t* cache_len, int block_size, int first_block, float* summaries);
void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                             const float* k_cache, const float* v_cache, int cache_capacity, const int32_t* cache_len,
                             const float* summaries, float* out);

}  // namespace tandem::kernels::ref
