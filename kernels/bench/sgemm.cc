// Prints the machine's sgemm ceiling: OpenBLAS cblas_sgemm (through the CPU
// backend's matmul) GFLOP/s for square n = 512, 1024, 2048 with 1 and 2
// threads. Usage: kernels_bench_sgemm [max_threads (default 2)]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bench/bench_util.h"

int main(int argc, char** argv) {
  using namespace tandem::kernels;
  const int max_threads = argc > 1 ? std::atoi(argv[1]) : 2;
  std::printf("%-8s %-8s %12s %10s\n", "threads", "n", "ms/call", "GFLOP/s");
  for (int threads = 1; threads <= max_threads; ++threads) {
    auto ops = MakeCpuOps(threads);
    for (int n : {512, 1024, 2048}) {
      const size_t nn = static_cast<size_t>(n) * n;
      std::vector<float> a(nn, 0.5f), b(nn, 0.25f), c(nn, 0.f);
      for (size_t i = 0; i < nn; ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
      const double s =
          bench::TimeIt([&] { ops->matmul(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); });
      const double gflops = 2.0 * n * n * static_cast<double>(n) / s * 1e-9;
      std::printf("%-8d %-8d %12.3f %10.1f\n", threads, n, s * 1e3, gflops);
    }
  }
  return 0;
}
