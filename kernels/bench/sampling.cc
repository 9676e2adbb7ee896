// Filtered sampling of one rollout step's logits, [rows, vocab] (default 64
// x 151936, Qwen's vocabulary), the two paths a worker can take:
//   host: the logits copied to host memory, then row by row through the
//         plain reference (kernels/sample_filter_row.h) on one thread, which
//         sorts each row (a full sort when top-k is off);
//   op:   Ops::sample_filtered on the backend (CPU: the same rule, rows
//         spread over the threads; only ids and log-probs come back).
// On a CUDA build with a device the op also runs on CudaOps (the kernel's
// threshold searches, no sort; device time with the three small copies).
// Times are the fastest call (bench_util.h).
// Usage: kernels_bench_sampling [rows (64)] [vocab (151936)] [threads (2)]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backends.h"
#include "kernels/bench/bench_util.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "kernels/sample_filter_row.h"

namespace {

using tandem::kernels::Ops;
using tandem::kernels::SampleFilter;
using tandem::kernels::bench::TimeIt;

struct Batch {
  int rows = 0, v = 0;
  std::vector<float> logits;
  std::vector<double> u;
  std::vector<int32_t> offsets, seen;  // 256 seen ids per row
};

Batch MakeBatch(int rows, int v) {
  Batch b;
  b.rows = rows;
  b.v = v;
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.f, 3.f);
  b.logits.resize(static_cast<size_t>(rows) * v);
  for (float& x : b.logits) x = logit(rng);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int r = 0; r < rows; ++r) b.u.push_back(unit(rng));
  b.offsets.push_back(0);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < 256; ++j) b.seen.push_back(static_cast<int32_t>(rng() % v));
    b.offsets.push_back(static_cast<int32_t>(b.seen.size()));
  }
  return b;
}

double HostPath(const Batch& b, const SampleFilter& f) {
  std::vector<float> host(b.logits.size());
  std::vector<int32_t> ids(b.rows);
  std::vector<float> lp(b.rows), raw(b.rows);
  tandem::kernels::SampleFilterScratch scratch;
  return TimeIt([&] {
    std::memcpy(host.data(), b.logits.data(), host.size() * sizeof(float));
    for (int r = 0; r < b.rows; ++r) {
      tandem::kernels::SampleFilteredRowAt(host.data(), r, b.v, f, b.offsets.data(), b.seen.data(), b.u.data(),
                                           ids.data(), lp.data(), raw.data(), scratch);
    }
  });
}

// The op on `ops` with its inputs in `mem`; the outputs are downloaded.
double OpPath(Ops& ops, tandem::kernels::DeviceMemory& mem, const Batch& b, const SampleFilter& f) {
  using tandem::kernels::DeviceArray;
  DeviceArray<float> logits, out_lp;
  DeviceArray<double> u;
  DeviceArray<int32_t> off, seen, ids;
  if (!logits.Allocate(&mem, b.logits.size()) || !u.Allocate(&mem, b.rows) || !off.Allocate(&mem, b.offsets.size()) ||
      !seen.Allocate(&mem, b.seen.size()) || !ids.Allocate(&mem, b.rows) || !out_lp.Allocate(&mem, 2 * b.rows)) {
    std::fprintf(stderr, "allocation failed\n");
    std::exit(1);
  }
  logits.Upload(b.logits.data(), b.logits.size());
  off.Upload(b.offsets.data(), b.offsets.size());
  seen.Upload(b.seen.data(), b.seen.size());
  std::vector<int32_t> h_ids(b.rows);
  std::vector<float> h_lp(2 * b.rows);
  return TimeIt([&] {
    u.Upload(b.u.data(), b.rows);
    ops.sample_filtered(logits.data(), b.rows, b.v, f, off.data(), seen.data(), u.data(), ids.data(), out_lp.data(),
                        out_lp.data() + b.rows);
    ids.Download(h_ids.data(), b.rows);
    out_lp.Download(h_lp.data(), 2 * static_cast<size_t>(b.rows));
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 64;
  const int v = argc > 2 ? std::atoi(argv[2]) : 151936;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  if (rows < 1 || v < 2 || threads < 1) {
    std::fprintf(stderr, "usage: kernels_bench_sampling [rows >= 1] [vocab >= 2] [threads >= 1]\n");
    return 2;
  }
  const Batch b = MakeBatch(rows, v);
  struct Case {
    const char* name;
    SampleFilter f;
  };
  const Case cases[] = {
      {"all filters (T 0.8, k 50, p 0.9, min_p 0.05, penalty 1.2)", {0.8f, 50, 0.9f, 0.05f, 1.2f}},
      {"top_p 0.95 only", {1.f, 0, 0.95f, 0.f, 1.f}},
      {"min_p 0.1 only", {1.f, 0, 1.f, 0.1f, 1.f}},
  };
  auto cpu = tandem::kernels::MakeCpuOps(threads);
  auto host_mem = tandem::kernels::MakeHostMemory();
#if defined(TANDEM_HAVE_CUDA)
  auto cuda = tandem::kernels::MakeCudaOps();
  auto cuda_mem = cuda ? tandem::kernels::MakeCudaMemory() : nullptr;
#endif
  std::printf("filtered sampling, %d rows x vocab %d, ms per step (fastest call)\n", rows, v);
  std::printf("%-58s %10s %12s %10s\n", "filters", "host", "op cpu", "op cuda");
  for (const Case& c : cases) {
    const double host = HostPath(b, c.f);
    const double op = OpPath(*cpu, *host_mem, b, c.f);
    double dev = -1;
#if defined(TANDEM_HAVE_CUDA)
    if (cuda && cuda_mem) dev = OpPath(*cuda, *cuda_mem, b, c.f);
#endif
    char dev_s[32] = "n/a";
    if (dev >= 0) std::snprintf(dev_s, sizeof dev_s, "%.3f", dev * 1e3);
    std::printf("%-58s %10.2f %12.2f %10s\n", c.name, host * 1e3, op * 1e3, dev_s);
  }
  return 0;
}
