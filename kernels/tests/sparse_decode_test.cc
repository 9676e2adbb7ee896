// Top-k block-sparse decode attention: with every block chosen it equals
// dense decode attention; summaries updated from the last block on equal a
// full recomputation after the cache grows; the chosen blocks hold the keys
// that dominate the softmax when one block is planted to match the query.
// (CPU vs reference over many shapes: the sparse_decode rows of
// kernels_ops_test.)
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backends.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomVec;
using testing::RelErr;

TEST(SparseDecode, AllBlocksEqualDenseDecode) {
  auto ops = MakeCpuOps(2);
  AttentionParams p;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  const int cap = 600, batch = 3, bs = 32;
  const std::vector<int32_t> lens{1, 333, 600};
  auto q = RandomVec(size_t(batch) * 8 * 64, 1), k = RandomVec(size_t(batch) * cap * 2 * 64, 2),
       v = RandomVec(k.size(), 3);
  std::vector<float> sum(size_t(batch) * ((cap + bs - 1) / bs) * 2 * 2 * 64), dense(q.size()), sparse(q.size());
  ops->key_block_summaries(p, batch, k.data(), cap, lens.data(), bs, 0, sum.data());
  ops->decode_attention(p, q.data(), batch, 1, k.data(), v.data(), cap, lens.data(), dense.data());
  SparseDecodeParams s{bs, 1000, 1, 2};
  ops->sparse_decode_attention(p, s, q.data(), batch, k.data(), v.data(), cap, lens.data(), sum.data(), sparse.data());
  EXPECT_LT(RelErr(sparse, dense), 1e-5);
}

TEST(SparseDecode, IncrementalSummariesEqualRecomputed) {
  auto ops = MakeCpuOps(1);
  AttentionParams p;
  p.num_heads = p.num_kv_heads = 2;
  p.head_dim = 16;
  const int cap = 200, bs = 16, nb = (cap + bs - 1) / bs;
  auto k = RandomVec(size_t(cap) * 2 * 16, 4);
  std::vector<float> inc(size_t(nb) * 2 * 2 * 16, 0.f), full(inc.size(), 0.f);
  for (int32_t len = 1; len <= 150; ++len) {  // one decode step at a time
    ops->key_block_summaries(p, 1, k.data(), cap, &len, bs, (len - 1) / bs, inc.data());
  }
  const int32_t len = 150;
  ops->key_block_summaries(p, 1, k.data(), cap, &len, bs, 0, full.data());
  EXPECT_EQ(inc, full);
}

TEST(SparseDecode, FindsThePlantedBlock) {
  auto ops = MakeCpuOps(1);
  AttentionParams p;
  p.num_heads = p.num_kv_heads = 1;
  p.head_dim = 32;
  const int cap = 4096, bs = 64;
  auto q = RandomVec(32, 5);
  auto k = RandomVec(size_t(cap) * 32, 6, -0.1, 0.1), v = RandomVec(k.size(), 7);
  for (int r = 1000; r < 1010; ++r)  // keys aligned with the query: block 15
    for (int e = 0; e < 32; ++e) k[size_t(r) * 32 + e] = 8.f * q[e];
  const int32_t len = cap;
  std::vector<float> sum(size_t(cap / bs) * 2 * 32), dense(32), sparse(32);
  ops->key_block_summaries(p, 1, k.data(), cap, &len, bs, 0, sum.data());
  ops->decode_attention(p, q.data(), 1, 1, k.data(), v.data(), cap, &len, dense.data());
  SparseDecodeParams s{bs, 1, 1, 1};  // 3 blocks of 64 out of 64
  ops->sparse_decode_attention(p, s, q.data(), 1, k.data(), v.data(), cap, &len, sum.data(), sparse.data());
  EXPECT_LT(RelErr(sparse, dense), 1e-2);
}

}  // namespace
}  // namespace tandem::kernels
