// Linear attention with decay benchmark (the chunked CPU kernel).
//
//   build/bin/kernels_bench_linear_attention [--threads 2] [--lengths 4096,16384]
//
// B = 1 sequence of T tokens, H = 8 heads, Dk = Dv = 64, data-dependent
// gate (log decay in [-0.1, 0]); forward (no final state) and backward (dq,
// dk, dv, d log decay). FLOP convention (the same in the PyTorch peer,
// bench/pytorch/linear_attention_peer.py, which runs the same chunked form
// with 64-token chunks): per chunk of L = 64 tokens and head, forward
// 2 L Dk Dv (inter) + 2 L^2 Dk (Q K^T, full square) + 2 L^2 Dv (A V) +
// 2 L Dk Dv (state); backward counts the 10 matmuls of the chunked backward
// (state recompute, dq inter, dP, dq intra, dk intra, dk state, A, dv, dv
// state, dS). Times: the fastest call (bench_util.h); "GFLOP per CPU-s"
// divides by the process CPU time instead, less distorted on a loaded
// machine. Prints a Markdown table.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bench/bench_util.h"

namespace {

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::vector<float> Random(size_t n, unsigned seed, float lo, float hi) {
  std::vector<float> v(n);
  unsigned s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * float(s >> 8) / float(1u << 24);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string lengths = "4096,16384";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--lengths")) lengths = argv[i + 1];
  }
  auto ops = tandem::kernels::MakeCpuOps(threads);
  const int H = 8, dk = 64, dv = 64, L = 64;
  std::printf("# Tandem fast CPU linear attention, %d threads, B=1 H=%d Dk=%d Dv=%d, gate, chunk %d\n", threads, H, dk,
              dv, L);
  std::printf("| T | fwd ms | bwd ms | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd GFLOP/s | GFLOP per CPU-s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::stringstream ss(lengths);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const int T = std::atoi(item.c_str());
    tandem::kernels::LinearAttentionParams p;
    p.num_heads = H;
    p.key_dim = dk;
    p.value_dim = dv;
    const size_t rows = size_t(T) * H;
    auto q = Random(rows * dk, 1, -1, 1), k = Random(rows * dk, 2, -1, 1), v = Random(rows * dv, 3, -1, 1),
         g = Random(rows, 4, -0.1f, 0), dout = Random(rows * dv, 5, -1, 1);
    std::vector<float> out(rows * dv), dq(rows * dk), dkk(rows * dk), dvv(rows * dv), dg(rows);
    const int32_t cu[2] = {0, T};
    auto fwd = [&] {
      ops->linear_attention_forward(p, q.data(), k.data(), v.data(), g.data(), cu, 1, T, nullptr, out.data(), nullptr);
    };
    auto bwd = [&] {
      ops->linear_attention_backward(p, q.data(), k.data(), v.data(), g.data(), cu, 1, T, nullptr, dout.data(), nullptr,
                                     dq.data(), dkk.data(), dvv.data(), dg.data(), nullptr);
    };
    const double per_chunk_fwd = 2.0 * L * dk * dv * 2 + 2.0 * L * L * (dk + dv);
    const double per_chunk_bwd = 2.0 * L * dk * dv * 5 + 2.0 * L * L * (3 * dk + 2 * dv);
    const double chunks = double(T) / L * H;
    const double f_fwd = per_chunk_fwd * chunks, f_bwd = per_chunk_bwd * chunks;
    const double c0 = ProcessCpuSeconds();
    const double tf = tandem::kernels::bench::TimeIt(fwd, 1.0, 3);
    const double tb = tandem::kernels::bench::TimeIt(bwd, 1.0, 3);
    // CPU time of one forward + backward pair, measured separately.
    const double c1 = ProcessCpuSeconds();
    fwd();
    bwd();
    const double cpu = ProcessCpuSeconds() - c1;
    (void)c0;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", T, tf * 1e3, tb * 1e3, f_fwd / tf * 1e-9,
                f_bwd / tb * 1e-9, (f_fwd + f_bwd) / (tf + tb) * 1e-9, (f_fwd + f_bwd) / cpu * 1e-9);
  }
  return 0;
}
