// Top-k block-sparse decode attention vs dense decode attention (fast CPU).
//
//   build/bin/kernels_bench_sparse_decode [--threads 2] [--lengths 8192,32768,65536]
//
// One sequence, one new token, H = 32, Hkv = 8, D = 128 (Llama-3-8B's
// attention shape), fp32 cache of `length` rows. Sparse: blocks of 64 rows,
// the first block, the last 2 and the top 16 others by their max/min bound
// (1216 rows attended). Times: the fastest call (bench_util.h). The summary
// update of one decode step (only the last block) is timed apart; a full
// summary pass (prefill) too. The same cache as a paged KV cache (pages of
// 16 rows, the rollout engine's layout): paged_attention against
// paged_sparse_attention with the same sparse blocks.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bench/bench_util.h"

int main(int argc, char** argv) {
  int threads = 2;
  std::string lengths = "8192,32768,65536";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--lengths")) lengths = argv[i + 1];
  }
  auto ops = tandem::kernels::MakeCpuOps(threads);
  tandem::kernels::AttentionParams p;
  p.num_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  const tandem::kernels::SparseDecodeParams s{64, 16, 1, 2};
  std::printf("# fast CPU, %d threads, H=32 Hkv=8 D=128, block 64, top 16 + 1 sink + 2 recent blocks\n", threads);
  std::printf(
      "| cache rows | dense ms | sparse ms | speed-up | paged dense ms | paged sparse ms | paged speed-up "
      "| step summary ms | full summary ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::stringstream ss(lengths);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int len = std::atoi(item.c_str());
    const size_t nc = size_t(len) * 8 * 128;
    std::vector<float> k(nc), v(nc), q(32 * 128), out(q.size());
    unsigned seed = 1;
    for (auto* x : {&k, &v, &q})
      for (float& e : *x) {
        seed = seed * 1664525u + 1013904223u;
        e = float(seed >> 8) / float(1u << 23) - 1.f;
      }
    const int nblk = (len + 63) / 64;
    std::vector<float> sum(size_t(nblk) * 8 * 2 * 128);
    const int32_t cl = len;
    auto full = [&] { ops->key_block_summaries(p, 1, k.data(), len, &cl, 64, 0, sum.data()); };
    auto step = [&] { ops->key_block_summaries(p, 1, k.data(), len, &cl, 64, nblk - 1, sum.data()); };
    full();
    auto dense = [&] { ops->decode_attention(p, q.data(), 1, 1, k.data(), v.data(), len, &cl, out.data()); };
    auto sparse = [&] {
      ops->sparse_decode_attention(p, s, q.data(), 1, k.data(), v.data(), len, &cl, sum.data(), out.data());
    };
    const double td = tandem::kernels::bench::TimeIt(dense, 0.5, 5);
    const double ts = tandem::kernels::bench::TimeIt(sparse, 0.5, 5);
    const double tst = tandem::kernels::bench::TimeIt(step, 0.2, 5);
    const double tf = tandem::kernels::bench::TimeIt(full, 0.5, 3);
    // Paged: pages of 16 rows in order; page summaries from one pass.
    constexpr int kPage = 16;
    const int pages = (len + kPage - 1) / kPage;
    std::vector<int32_t> table(pages), slots(len);
    for (int i = 0; i < pages; ++i) table[i] = i;
    for (int i = 0; i < len; ++i) slots[i] = i;
    k.resize(size_t(pages) * kPage * 8 * 128);
    v.resize(k.size());
    tandem::kernels::PagedKv kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.block_size = kPage;
    kv.num_blocks = pages;
    kv.block_tables = table.data();
    kv.max_blocks = pages;
    std::vector<float> psum(size_t(pages) * 8 * 2 * 128);
    ops->paged_key_summaries(p, kv, slots.data(), len, psum.data());
    const int32_t seq = 0, pos = len - 1;
    auto pdense = [&] { ops->paged_attention(p, kv, q.data(), &seq, &pos, 1, out.data()); };
    auto psparse = [&] { ops->paged_sparse_attention(p, s, kv, psum.data(), q.data(), &seq, &pos, 1, out.data()); };
    const double tpd = tandem::kernels::bench::TimeIt(pdense, 0.5, 5);
    const double tps = tandem::kernels::bench::TimeIt(psparse, 0.5, 5);
    std::printf("| %d | %.3f | %.3f | %.1fx | %.3f | %.3f | %.1fx | %.4f | %.2f |\n", len, td * 1e3, ts * 1e3, td / ts,
                tpd * 1e3, tps * 1e3, tpd / tps, tst * 1e3, tf * 1e3);
  }
  return 0;
}
