// bench_collectives: collective bandwidth in the style of nccl-tests, for
// Tandem's Collective (Gloo backend) and for raw Gloo calls side by side.
//
//   bench_collectives [--ranks N] [--min-bytes B] [--max-bytes B]
//                     [--ops allreduce,reduce_scatter,allgather,broadcast]
//                     [--address 127.0.0.1] [--seconds S] [--raw-first]
//   bench_collectives --rank R --ranks N --store DIR ...   (one rank only)
//
// Without --rank the program forks N ranks on this machine; they meet through
// a FileStore in a temporary directory (Tandem) and Gloo's FileStore (raw).
// Sizes double from min to max bytes (default 1 KiB .. 256 MiB). For each
// size: a checked warm-up call each, then as many iterations as fit in
// --seconds (at least 4, at most 1000), Tandem and raw Gloo alternating call
// by call, in swapped order every other iteration. Time = maximum over ranks of the median per-call time. algbw = bytes
// / time; busbw = algbw x factor (allreduce 2(N-1)/N, reduce_scatter and allgather (N-1)/N, broadcast 1), bytes being
// the full buffer (N x the per-rank piece for reduce_scatter and allgather, as nccl-tests counts). #wrong counts output
// elements that differ from the exact expected value after one checked call
// (inputs are small integers, so sums are exact).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "absl/strings/str_split.h"
#include "worker/comm/collective.h"
#include "worker/comm/file_store.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::comm::Collective;
using tandem::comm::ReduceOp;
using tandem::comm::Timeout;

struct Flags {
  int ranks = 2;
  int rank = -1;
  size_t min_bytes = 1024;
  size_t max_bytes = 256ull << 20;
  std::vector<std::string> ops = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
  std::string address = "127.0.0.1";
  std::string store;
  double seconds = 0.3;
  bool raw_first = false;
};

size_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  if (unit == "K" || unit == "k" || unit == "KB") v *= 1024;
  if (unit == "M" || unit == "m" || unit == "MB") v *= 1024 * 1024;
  if (unit == "G" || unit == "g" || unit == "GB") v *= 1024.0 * 1024 * 1024;
  return static_cast<size_t>(v);
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") f.ranks = std::atoi(next().c_str());
    else if (a == "--rank") f.rank = std::atoi(next().c_str());
    else if (a == "--min-bytes") f.min_bytes = ParseBytes(next());
    else if (a == "--max-bytes") f.max_bytes = ParseBytes(next());
    else if (a == "--ops") f.ops = absl::StrSplit(next(), ',');
    else if (a == "--address") f.address = next();
    else if (a == "--store") f.store = next();
    else if (a == "--seconds") f.seconds = std::atof(next().c_str());
    else if (a == "--raw-first") f.raw_first = true;
    else {
      std::fprintf(stderr, "unknown flag %s (see the header of %s)\n", a.c_str(), __FILE__);
      std::exit(2);
    }
  }
  return f;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_collectives: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

// Raw Gloo: one context of our own, the same algorithms the backend uses
// (halving-doubling for reduce_scatter, the Gloo class Gloo provides).
struct RawGloo {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
};

struct Bufs {
  std::vector<float> in, out, work;
};

double BusFactor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return double(n - 1) / n;
}

float InputValue(int rank, size_t i) { return static_cast<float>((rank + 1) * (int(i % 7) + 1)); }

// Fills inputs for `op` with `count` elements per rank (piece for RS/AG).
void Fill(const std::string& op, int rank, int n, size_t total, Bufs& b) {
  if (op == "allgather") {
    const size_t piece = total / n;
    for (size_t i = 0; i < piece; ++i) b.in[i] = InputValue(rank, i);
  } else {
    for (size_t i = 0; i < total; ++i) b.in[i] = InputValue(rank, i);
  }
}

size_t CountWrong(const std::string& op, int rank, int n, size_t total, const float* result) {
  size_t wrong = 0;
  const float sum_coef = n * (n + 1) / 2.f;
  if (op == "allreduce") {
    for (size_t i = 0; i < total; ++i) wrong += result[i] != sum_coef * ((i % 7) + 1);
  } else if (op == "reduce_scatter") {
    const size_t piece = total / n;
    for (size_t i = 0; i < piece; ++i) wrong += result[i] != sum_coef * (((rank * piece + i) % 7) + 1);
  } else if (op == "allgather") {
    const size_t piece = total / n;
    for (size_t i = 0; i < total; ++i) wrong += result[i] != InputValue(int(i / piece), i % piece);
  } else {  // broadcast from root 0
    for (size_t i = 0; i < total; ++i) wrong += result[i] != InputValue(0, i);
  }
  return wrong;
}

// One iteration of `op` through Tandem's interface (data in b.in or b.out).
absl::Status RunTandem(const std::string& op, Collective& c, size_t total, Bufs& b, bool prepare) {
  const int n = c.size();
  const Timeout t(600000);
  if (op == "allreduce") {
    if (prepare) std::copy(b.in.begin(), b.in.begin() + total, b.out.begin());
    return c.allreduce(b.out.data(), total, ReduceOp::kSum, t);
  }
  if (op == "reduce_scatter") {
    return c.reduce_scatter(b.in.data(), b.out.data(), std::vector<size_t>(n, total / n), t);
  }
  if (op == "allgather") {
    return c.allgather(b.in.data(), b.out.data(), std::vector<size_t>(n, total / n), t);
  }
  if (prepare) std::copy(b.in.begin(), b.in.begin() + total, b.out.begin());
  return c.broadcast(b.out.data(), total, 0, t);
}

// The same through raw Gloo.
void RunRaw(const std::string& op, RawGloo& g, size_t total, Bufs& b, bool prepare,
            std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>>* rs) {
  const int n = g.context->size;
  if (op == "allreduce") {
    if (prepare) std::copy(b.in.begin(), b.in.begin() + total, b.out.begin());
    gloo::AllreduceOptions o(g.context);
    o.setOutput(b.out.data(), total);
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(o);
  } else if (op == "reduce_scatter") {
    // In place on a full buffer: restore the input every iteration (the
    // Tandem backend copies its const input the same way).
    std::copy(b.in.begin(), b.in.begin() + total, b.work.begin());
    if (!*rs) {
      rs->reset(new gloo::ReduceScatterHalvingDoubling<float>(g.context, std::vector<float*>{b.work.data()}, int(total),
                                                              std::vector<int>(n, int(total / n))));
    }
    (*rs)->run();
    std::copy(b.work.begin(), b.work.begin() + total / n, b.out.begin());
  } else if (op == "allgather") {
    gloo::AllgathervOptions o(g.context);
    o.setInput(b.in.data(), total / n);
    o.setOutput(b.out.data(), std::vector<size_t>(n, total / n));
    gloo::allgatherv(o);
  } else {
    if (prepare) std::copy(b.in.begin(), b.in.begin() + total, b.out.begin());
    gloo::BroadcastOptions o(g.context);
    o.setOutput(b.out.data(), total);
    o.setRoot(0);
    gloo::broadcast(o);
  }
}

double MaxOverRanks(Collective& c, double v) {
  float x = static_cast<float>(v);
  Check(c.allreduce(&x, 1, ReduceOp::kMax, Timeout(600000)), "allreduce max");
  return x;
}

RawGloo ConnectRaw(const Flags& f, int rank) {
  RawGloo raw;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = f.address;
    raw.device = gloo::transport::tcp::CreateDevice(attr);
    std::filesystem::create_directories(f.store + "/raw");
    gloo::rendezvous::FileStore fs(f.store + "/raw");
    raw.context = std::make_shared<gloo::rendezvous::Context>(rank, f.ranks);
    raw.context->setTimeout(std::chrono::seconds(600));
    raw.context->connectFullMesh(fs, raw.device);
  } catch (const std::exception& e) {
    Die(std::string("raw gloo rendezvous: ") + e.what());
  }

  return raw;
}

int RunRank(const Flags& f, int rank) {
  const int n = f.ranks;
  // Creation order of the two Gloo contexts is a flag (--raw-first) to rule
  // out order effects when comparing the columns.
  RawGloo raw;
  if (f.raw_first) raw = ConnectRaw(f, rank);
  tandem::comm::FileStore store(f.store + "/tandem");
  tandem::comm::CollectiveOptions opts;
  opts.address = f.address;
  opts.timeout = Timeout(120000);
  auto made = tandem::comm::MakeCollective("gloo", store, rank, n, opts);
  if (!made.ok()) Die(made.status().ToString());
  Collective& c = **made;

  if (!f.raw_first) raw = ConnectRaw(f, rank);

  const size_t max_elems = f.max_bytes / 4;
  Bufs b;
  b.in.resize(max_elems);
  b.out.resize(max_elems);
  b.work.resize(max_elems);

  if (rank == 0) {
    std::printf(
        "# bench_collectives: %d ranks (processes) on %s, float32, "
        "Tandem Collective (gloo backend) vs raw Gloo\n",
        n, f.address.c_str());
    std::printf("# %-14s %11s %10s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s\n", "op", "size(B)", "count",
                "tandem(us)", "algbw", "busbw", "#wrong", "gloo(us)", "algbw", "busbw", "#wrong", "ratio");
    std::printf("# %-14s %11s %10s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s\n", "", "", "(elems)", "", "GB/s",
                "GB/s", "", "", "GB/s", "GB/s", "", "busbw");
  }
  for (const auto& op : f.ops) {
    std::vector<double> ratios;
    for (size_t bytes = f.min_bytes; bytes <= f.max_bytes; bytes *= 2) {
      size_t total = bytes / 4;
      total -= total % n;  // RS / AG need N equal pieces
      if (total == 0) continue;
      std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
      Fill(op, rank, n, total, b);
      // Correctness (one call each), also the warm-up.
      Check(RunTandem(op, c, total, b, true), op.c_str());
      const size_t t_wrong = CountWrong(op, rank, n, total, b.out.data());
      std::fill(b.out.begin(), b.out.begin() + total, 0.f);
      try {
        RunRaw(op, raw, total, b, true, &rs);
      } catch (const std::exception& e) {
        Die(std::string("raw gloo: ") + e.what());
      }
      const size_t g_wrong = CountWrong(op, rank, n, total, b.out.data());
      // Iterations: estimate from one timed call, agree across ranks.
      Check(c.barrier(Timeout(600000)), "barrier");
      auto t0 = Clock::now();
      Check(RunTandem(op, c, total, b, false), op.c_str());
      double est = std::chrono::duration<double>(Clock::now() - t0).count();
      est = MaxOverRanks(c, est);
      const int iters = std::clamp(static_cast<int>(f.seconds / 2 / std::max(est, 1e-6)), 4, 1000);
      // Alternate call by call so load drift hits both columns alike; keep
      // the median of the per-call times (robust to scheduler spikes on a
      // shared machine), then the maximum over ranks.
      std::vector<double> tt, tr;
      Check(c.barrier(Timeout(600000)), "barrier");
      auto time_tandem = [&] {
        const auto start = Clock::now();
        Check(RunTandem(op, c, total, b, false), op.c_str());
        tt.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      };
      auto time_raw = [&] {
        const auto start = Clock::now();
        RunRaw(op, raw, total, b, false, &rs);
        tr.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      };
      // Swap the order every iteration: the first call of a pair absorbs the
      // skew between ranks left by the previous one.
      for (int i = 0; i < iters; ++i) {
        if (i % 2 == 0) {
          time_tandem();
          time_raw();
        } else {
          time_raw();
          time_tandem();
        }
      }
      auto median = [](std::vector<double>& v) {
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
      };
      double t_tandem = MaxOverRanks(c, median(tt));
      double t_raw = MaxOverRanks(c, median(tr));
      float wrong[2] = {float(t_wrong), float(g_wrong)};
      Check(c.allreduce(wrong, 2, ReduceOp::kSum, Timeout(600000)), "wrong");
      if (rank == 0) {
        const double nbytes = total * 4.0;
        const double bus = BusFactor(op, n);
        const double a_t = nbytes / t_tandem / 1e9, a_g = nbytes / t_raw / 1e9;
        std::printf(
            "  %-14s %11.0f %10zu | %10.1f %8.3f %8.3f %6.0f | %10.1f "
            "%8.3f %8.3f %6.0f | %5.1f%%\n",
            op.c_str(), nbytes, total, t_tandem * 1e6, a_t, a_t * bus, wrong[0], t_raw * 1e6, a_g, a_g * bus, wrong[1],
            100.0 * a_t / a_g);
        std::fflush(stdout);
        ratios.push_back(a_t / a_g);
      }
    }
    if (rank == 0 && !ratios.empty()) {
      double log_sum = 0;
      for (double r : ratios) log_sum += std::log(r);
      std::vector<double> sorted = ratios;
      std::sort(sorted.begin(), sorted.end());
      std::printf(
          "# %s: Tandem/raw Gloo bandwidth over %zu sizes: median "
          "%.1f%%, geometric mean %.1f%%\n",
          op.c_str(), ratios.size(), 100 * sorted[sorted.size() / 2], 100 * std::exp(log_sum / ratios.size()));
      std::fflush(stdout);
    }
  }
  Check(c.barrier(Timeout(600000)), "final barrier");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f = ParseFlags(argc, argv);
  if (f.ranks < 1) Die("--ranks must be >= 1");
  if (f.rank >= 0) {
    if (f.store.empty()) Die("--rank needs --store DIR (shared by all ranks)");
    return RunRank(f, f.rank);
  }
  // Fork N ranks sharing a fresh store directory.
  const auto dir = std::filesystem::temp_directory_path() / ("bench_collectives." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  f.store = dir.string();
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < f.ranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) _exit(RunRank(f, r));
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
