// Throughput of the fast CPU ops (GB/s for memory-bound ops, GFLOP/s for the
// fused LM head), each as a fraction of this machine's ceilings from
// shared/BUILD-NOTES.md: memory (STREAM triad) 30 GB/s on 2 cores, 23 GB/s on
// one; sgemm 210 GFLOP/s on 2 cores, 100 GFLOP/s on one. Bytes count each
// tensor read or written once (small tensors stay in cache, so some ops
// exceed the DRAM figure).
// Usage: kernels_bench_ops [threads (default 2)] [lm_head chunk tokens (256)]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bench/bench_util.h"
#include "kernels/ops.h"

namespace {

using tandem::kernels::bench::TimeIt;

double g_mem_gbs = 30.0;  // set in main from the thread count
double g_sgemm_gflops = 210.0;

// Deterministic pseudo-random fill; every call a different stream, so no two
// buffers hold identical pages.
std::vector<float> Filled(size_t n, float scale) {
  static uint32_t stream = 1;
  std::vector<float> v(n);
  uint32_t s = 12345u * ++stream;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.f - 0.5f);
  }
  return v;
}

void ReportBytes(const std::string& what, double seconds, double bytes) {
  const double gbs = bytes / seconds * 1e-9;
  std::printf("%-44s %10.3f ms %9.1f GB/s   %5.0f%% of %.0f GB/s\n", what.c_str(), seconds * 1e3, gbs,
              100.0 * gbs / g_mem_gbs, g_mem_gbs);
}

void ReportFlops(const std::string& what, double seconds, double flops) {
  const double gf = flops / seconds * 1e-9;
  std::printf("%-44s %10.3f ms %9.1f GFLOP/s %5.0f%% of %.0f GFLOP/s\n", what.c_str(), seconds * 1e3, gf,
              100.0 * gf / g_sgemm_gflops, g_sgemm_gflops);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::kernels;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto ops = MakeCpuOps(threads);
  if (CpuThreads() == 1) {
    g_mem_gbs = 23.0;
    g_sgemm_gflops = 100.0;
  }
  std::printf("CPU backend, %d threads (ceilings %.0f GB/s, %.0f GFLOP/s)\n", CpuThreads(), g_mem_gbs, g_sgemm_gflops);
  const int t = 2048;

  for (int c : {256, 512}) {
    const size_t n = static_cast<size_t>(t) * c;
    auto x = Filled(n, 2.f), w = Filled(c, 1.f), dy = Filled(n, 1.f);
    std::vector<float> y(n), rstd(t), dx(n), dw(c);
    const std::string shape = " T=" + std::to_string(t) + " C=" + std::to_string(c);
    ReportBytes("rmsnorm fwd" + shape,
                TimeIt([&] { ops->rmsnorm_forward(x.data(), w.data(), t, c, 1e-5f, y.data(), rstd.data()); }),
                2.0 * n * 4);
    ReportBytes("rmsnorm bwd" + shape, TimeIt([&] {
                  ops->rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), t, c, dx.data(), dw.data());
                }),
                3.0 * n * 4);
  }

  {
    // Interference check: an OpenMP op right after an OpenBLAS call (BLAS
    // worker threads may still be spinning when the OpenMP team starts).
    const int c = 256, n = 512;
    const size_t rows = static_cast<size_t>(t) * c;
    auto x = Filled(rows, 2.f), w = Filled(c, 1.f);
    auto a = Filled(static_cast<size_t>(n) * n, 1.f), b = Filled(static_cast<size_t>(n) * n, 1.f);
    std::vector<float> y(rows), rstd(t), cm(static_cast<size_t>(n) * n);
    auto gemm = [&] { ops->matmul(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, cm.data(), n); };
    auto norm = [&] { ops->rmsnorm_forward(x.data(), w.data(), t, c, 1e-5f, y.data(), rstd.data()); };
    const double alone = TimeIt(norm);
    const double g = TimeIt(gemm);
    const double both = TimeIt([&] {
      gemm();
      norm();
    });
    std::printf("%-44s %10.3f ms (alone %.3f ms, sgemm 512^3 %.3f ms)\n", "rmsnorm fwd C=256 right after an sgemm",
                (both - g) * 1e3, alone * 1e3, g * 1e3);
  }

  for (int inter : {688, 1376}) {
    const size_t n = static_cast<size_t>(t) * inter;
    auto g = Filled(n, 8.f), u = Filled(n, 2.f), dh = Filled(n, 1.f);
    std::vector<float> h(n), dg(n), du(n);
    const std::string shape = " T=" + std::to_string(t) + " I=" + std::to_string(inter);
    ReportBytes("swiglu fwd" + shape, TimeIt([&] { ops->swiglu_forward(g.data(), u.data(), n, h.data()); }),
                3.0 * n * 4);
    ReportBytes("swiglu bwd" + shape,
                TimeIt([&] { ops->swiglu_backward(dh.data(), g.data(), u.data(), n, dg.data(), du.data()); }),
                5.0 * n * 4);
  }

  {
    const int nh = 8, d = 64, max_pos = t;
    RopeConfig cfg;
    cfg.head_dim = d;
    std::vector<float> cos(static_cast<size_t>(max_pos) * d / 2), sin(cos.size());
    rope_tables(cfg, max_pos, max_pos, cos.data(), sin.data());
    std::vector<int32_t> pos(t);
    for (int i = 0; i < t; ++i) pos[i] = i;
    const size_t n = static_cast<size_t>(t) * nh * d;
    auto x = Filled(n, 1.f);
    ReportBytes("rope fwd T=2048 H=8 D=64",
                TimeIt([&] { ops->rope_apply(x.data(), pos.data(), t, nh, d, cos.data(), sin.data(), false); }),
                2.0 * n * 4 + 2.0 * cos.size() * 4);
  }

  const int chunk = argc > 2 ? std::atoi(argv[2]) : 256;
  std::printf("lm_head chunk_tokens = %d\n", chunk);
  for (int c : {256, 512}) {
    for (int v : {512, 4096}) {
      auto h = Filled(static_cast<size_t>(t) * c, 2.f);
      auto w = Filled(static_cast<size_t>(v) * c, 0.2f);
      std::vector<int32_t> tg(t);
      for (int i = 0; i < t; ++i) tg[i] = (i * 7919) % v;
      std::vector<float> scratch(static_cast<size_t>(chunk) * v), logp(t), ent(t), dlogp(t, -1.f / t), dh(h.size()),
          dw(w.size());
      const std::string shape = " T=2048 C=" + std::to_string(c) + " V=" + std::to_string(v);
      const double gemm = 2.0 * t * static_cast<double>(c) * v;
      ReportFlops("lm_head fwd" + shape, TimeIt([&] {
                    ops->lm_head_logprobs_forward(h.data(), w.data(), tg.data(), t, c, v, chunk, scratch.data(),
                                                  logp.data(), ent.data());
                  }),
                  gemm);
      ReportFlops("lm_head bwd" + shape, TimeIt([&] {
                    ops->lm_head_logprobs_backward(h.data(), w.data(), tg.data(), dlogp.data(), t, c, v, chunk,
                                                   scratch.data(), dh.data(), dw.data());
                  }),
                  3.0 * gemm);
      // The bare GEMM of the forward, for comparison.
      ReportFlops("  (plain sgemm [T,C]x[C,V]" + shape + ")", TimeIt([&] {
                    for (int t0 = 0; t0 < t; t0 += chunk)
                      ops->matmul(false, true, chunk, v, c, 1.f, h.data() + static_cast<size_t>(t0) * c, c, w.data(), c,
                                  0.f, scratch.data(), v);
                  }),
                  gemm);
    }
  }

  // Paged decode attention: one query row per sequence, pages of 16 rows
  // in shuffled order, each sequence `len` positions long (config A's
  // shape, then a 128-wide head). Bytes: the K and V rows read once.
  for (auto [h, hkv, d] : {std::tuple{8, 2, 32}, std::tuple{32, 8, 128}}) {
    const int seqs = 16, len = 256, bs = 16, per = len / bs, pages = seqs * per;
    const int kd = hkv * d;
    auto k = Filled(static_cast<size_t>(pages) * bs * kd, 1.f), v = Filled(k.size(), 1.f);
    auto q = Filled(static_cast<size_t>(seqs) * h * d, 1.f);
    std::vector<float> out(q.size());
    std::vector<int32_t> table(static_cast<size_t>(pages)), row_seq(seqs), row_pos(seqs, len - 1);
    for (int i = 0; i < pages; ++i) table[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 37) % pages);
    for (int s = 0; s < seqs; ++s) row_seq[s] = s;
    AttentionParams p;
    p.num_heads = h;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    PagedKv kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.block_size = bs;
    kv.num_blocks = pages;
    kv.block_tables = table.data();
    kv.max_blocks = per;
    const std::string shape =
        " B=16 pos=256 H=" + std::to_string(h) + "/" + std::to_string(hkv) + " D=" + std::to_string(d);
    ReportBytes("paged decode attention" + shape, TimeIt([&] {
                  ops->paged_attention(p, kv, q.data(), row_seq.data(), row_pos.data(), seqs, out.data());
                }),
                2.0 * k.size() * 4);
  }

  {
    const size_t n = 10'000'000;
    auto p = Filled(n, 1.f), g = Filled(n, 1.f), m = Filled(n, 0.1f);
    std::vector<float> v(n, 0.01f);
    int64_t step = 1;
    ReportBytes("adamw n=10M (7 x 4 B per param)", TimeIt([&] {
                  ops->adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step++);
                }),
                7.0 * n * 4);
    volatile double sink = 0;
    ReportBytes("sum_squares n=10M", TimeIt([&] { sink = sink + ops->sum_squares(g.data(), n); }), 1.0 * n * 4);
    ReportBytes("add_inplace n=10M", TimeIt([&] { ops->add_inplace(p.data(), g.data(), n); }), 3.0 * n * 4);
  }
  return 0;
}
