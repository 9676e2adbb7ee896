// Top-k block-sparse attention over a paged KV cache: with every block
// chosen it equals paged_attention; over shuffled pages it equals the
// contiguous sparse_decode_attention on the same keys (the same blocks are
// chosen); page summaries grown a chunk at a time equal one pass; a row
// never attends past its own position. (CPU vs reference over many shapes:
// the paged_sparse rows of kernels_ops_test.)
#include <cmath>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backends.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomVec;
using testing::RelErr;

// One sequence of `len` positions in pages of `page` rows handed out in a
// shuffled order, every row written and summarised.
struct PagedSeq {
  PagedSeq(Ops& ops, const AttentionParams& p, int len, int page, uint64_t seed)
      : kd(p.num_kv_heads * p.head_dim), page(page) {
    const int pages = (len + page - 1) / page;
    table.resize(pages);
    for (int i = 0; i < pages; ++i) table[i] = (i * 5 + 2) % pages;
    if (std::gcd(5, pages) != 1) std::iota(table.rbegin(), table.rend(), 0);  // still a permutation
    k = RandomVec(size_t(len) * kd, seed);
    v = RandomVec(k.size(), seed + 1);
    pool_k.assign(size_t(pages) * page * kd, 0.f);
    pool_v.assign(pool_k.size(), 0.f);
    sum.assign(size_t(pages) * p.num_kv_heads * 2 * p.head_dim, 0.f);
    for (int j = 0; j < len; ++j) slots.push_back(table[j / page] * page + j % page);
    kv.k = pool_k.data();
    kv.v = pool_v.data();
    kv.block_size = page;
    kv.num_blocks = pages;
    kv.block_tables = table.data();
    kv.max_blocks = pages;
    ops.paged_kv_write(kv, kd, k.data(), v.data(), slots.data(), len);
    ops.paged_key_summaries(p, kv, slots.data(), len, sum.data());
  }
  int kd, page;
  std::vector<int32_t> table, slots;
  std::vector<float> k, v, pool_k, pool_v, sum;
  PagedKv kv;
};

AttentionParams Heads(int h, int hkv, int d) {
  AttentionParams p;
  p.num_heads = h;
  p.num_kv_heads = hkv;
  p.head_dim = d;
  return p;
}

TEST(PagedSparse, AllBlocksEqualPagedAttention) {
  auto ops = MakeCpuOps(2);
  const AttentionParams p = Heads(8, 2, 64);
  PagedSeq s(*ops, p, 700, 16, 1);
  const std::vector<int32_t> seq(4, 0), pos{0, 37, 500, 699};
  auto q = RandomVec(size_t(4) * 8 * 64, 3);
  std::vector<float> dense(q.size()), sparse(q.size());
  ops->paged_attention(p, s.kv, q.data(), seq.data(), pos.data(), 4, dense.data());
  ops->paged_sparse_attention(p, {64, 1000, 1, 1}, s.kv, s.sum.data(), q.data(), seq.data(), pos.data(), 4,
                              sparse.data());
  EXPECT_LT(RelErr(sparse, dense), 1e-5);
}

TEST(PagedSparse, EqualsContiguousSparseDecode) {
  auto ops = MakeCpuOps(2);
  auto ref = MakeReferenceOps();
  const AttentionParams p = Heads(4, 2, 32);
  const int len = 900, page = 16;
  PagedSeq s(*ops, p, len, page, 4);
  auto q = RandomVec(size_t(4) * 32, 6);
  for (int block : {16, 64}) {
    const SparseDecodeParams sp{block, 3, 1, 2};
    std::vector<float> sum(size_t((len + block - 1) / block) * 2 * 2 * 32), want(q.size()), got(q.size());
    ref->key_block_summaries(p, 1, s.k.data(), len, &len, block, 0, sum.data());
    ref->sparse_decode_attention(p, sp, q.data(), 1, s.k.data(), s.v.data(), len, &len, sum.data(), want.data());
    const int32_t seq = 0, pos = len - 1;
    ops->paged_sparse_attention(p, sp, s.kv, s.sum.data(), q.data(), &seq, &pos, 1, got.data());
    EXPECT_LT(RelErr(got, want), 1e-5) << "block " << block;
  }
}

TEST(PagedSparse, SummariesGrownInChunksEqualOnePass) {
  auto ops = MakeCpuOps(1);
  const AttentionParams p = Heads(2, 2, 16);
  PagedSeq one(*ops, p, 150, 16, 7);
  std::vector<float> grown(one.sum.size(), -5.f);
  // Prefill chunk, decode rows one at a time, another chunk.
  for (auto [a, b] : {std::pair{0, 40}, {40, 41}, {41, 42}, {42, 150}}) {
    ops->paged_key_summaries(p, one.kv, one.slots.data() + a, b - a, grown.data());
  }
  EXPECT_EQ(grown, one.sum);
}

// A copy-on-write page holds another sequence's rows past the shared
// prefix: writing offset j makes the summary that of rows 0..j only.
TEST(PagedSparse, RowsPastTheWrittenOffsetDoNotCount) {
  auto ops = MakeCpuOps(1);
  auto ref = MakeReferenceOps();
  const AttentionParams p = Heads(2, 2, 16);
  PagedSeq a(*ops, p, 16, 16, 20);                          // one full page
  std::vector<float> k = RandomVec(16 * 32, 21, 5.0, 6.0);  // far larger keys...
  const std::vector<int32_t> tail{a.slots.begin() + 10, a.slots.end()};
  ops->paged_kv_write(a.kv, 32, k.data(), k.data(), tail.data(), 6);  // ...in rows 10..15
  std::vector<float> got(a.sum.size()), got_ref(a.sum.size());
  PagedSeq first10(*ops, p, 10, 16, 20);  // rows 0..9 alone
  ops->paged_key_summaries(p, a.kv, a.slots.data() + 9, 1, got.data());
  ref->paged_key_summaries(p, a.kv, a.slots.data() + 9, 1, got_ref.data());
  EXPECT_EQ(got, first10.sum);
  EXPECT_EQ(got_ref, first10.sum);
}

TEST(PagedSparse, ARowNeverSeesLaterPositions) {
  // Keys after position 100 aligned with the query: a row at 100 must not
  // attend them even though their pages rank first.
  auto ops = MakeCpuOps(1);
  const AttentionParams p = Heads(1, 1, 32);
  PagedSeq s(*ops, p, 400, 16, 9);
  auto q = RandomVec(32, 10);
  std::vector<float> k = s.k;
  for (int r = 101; r < 400; ++r)
    for (int e = 0; e < 32; ++e) k[size_t(r) * 32 + e] = 8.f * q[e];
  ops->paged_kv_write(s.kv, 32, k.data(), s.v.data(), s.slots.data(), 400);
  ops->paged_key_summaries(p, s.kv, s.slots.data(), 400, s.sum.data());
  const int32_t seq = 0, pos = 100;
  std::vector<float> dense(32), sparse(32);
  ops->paged_attention(p, s.kv, q.data(), &seq, &pos, 1, dense.data());
  ops->paged_sparse_attention(p, {16, 1000, 0, 1}, s.kv, s.sum.data(), q.data(), &seq, &pos, 1, sparse.data());
  EXPECT_LT(RelErr(sparse, dense), 1e-5);
}

TEST(PagedSparse, FindsThePlantedBlock) {
  auto ops = MakeCpuOps(1);
  const AttentionParams p = Heads(1, 1, 32);
  PagedSeq s(*ops, p, 4096, 16, 11);
  auto q = RandomVec(32, 12);
  std::vector<float> k = RandomVec(s.k.size(), 13, -0.1, 0.1);
  for (int r = 1000; r < 1010; ++r)  // keys aligned with the query: block 15 of 64
    for (int e = 0; e < 32; ++e) k[size_t(r) * 32 + e] = 8.f * q[e];
  ops->paged_kv_write(s.kv, 32, k.data(), s.v.data(), s.slots.data(), 4096);
  ops->paged_key_summaries(p, s.kv, s.slots.data(), 4096, s.sum.data());
  const int32_t seq = 0, pos = 4095;
  std::vector<float> dense(32), sparse(32);
  ops->paged_attention(p, s.kv, q.data(), &seq, &pos, 1, dense.data());
  ops->paged_sparse_attention(p, {64, 1, 1, 1}, s.kv, s.sum.data(), q.data(), &seq, &pos, 1, sparse.data());
  EXPECT_LT(RelErr(sparse, dense), 1e-2);
}

}  // namespace
}  // namespace tandem::kernels
