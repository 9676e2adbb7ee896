// Gradient reductions: fp32 reduce-scatter / allreduce against the int4
// (LoCo) exchange with error feedback, and the flat against the
// hierarchical allreduce (2 "nodes"), for N ranks as threads over Gloo on
// 127.0.0.1. Prints the median time of `reps` calls (the slowest rank's)
// and the bytes all ranks sent in one call, in total and across nodes
// (ranks split into two nodes of N/2).
//
//   ./build/bin/bench_grad_compression [floats=4194304] [reps=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/comm/collective.h"
#include "worker/comm/node_collectives.h"
#include "worker/comm/quantized_collectives.h"
#include "worker/comm/store.h"
#include "worker/comm/tiered_collective.h"

namespace tandem::comm {
namespace {

struct Row {
  double ms = 0;
  uint64_t sent = 0, inter = 0;
};

using Op = std::function<absl::Status(int rank, Collective& flat, NodeCollectives& groups, std::vector<float>& data)>;

Row Measure(int n, size_t floats, int reps, const Op& op) {
  InMemoryStore store;
  std::vector<std::string> nodes(n);
  for (int r = 0; r < n; ++r) nodes[r] = r < n / 2 ? "a" : "b";
  Row row;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CollectiveOptions o;
      o.timeout = Timeout(120000);
      auto ledger = std::make_shared<TierLedger>();
      auto c = MakeCollective("gloo", store, r, n, o);
      if (!c.ok()) std::abort();
      auto flat = MakeTieredCollective(std::move(*c), nodes, ledger);
      o.prefix = "groups";
      auto groups = MakeNodeCollectives("gloo", store, nodes, r, o, ledger);
      if (!flat.ok() || !groups.ok()) std::abort();
      std::vector<float> data(floats);
      for (size_t i = 0; i < floats; ++i) data[i] = static_cast<float>((i * 7919 + r) % 1000) * 1e-3f - 0.5f;
      std::vector<double> times;
      for (int k = 0; k < reps + 1; ++k) {  // the first call warms up
        if (!(*flat)->barrier(Timeout(120000)).ok()) std::abort();
        ledger->Reset();
        const auto t0 = std::chrono::steady_clock::now();
        if (!op(r, **flat, *groups, data).ok()) std::abort();
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      times.erase(times.begin());
      std::sort(times.begin(), times.end());
      std::lock_guard<std::mutex> lock(mu);
      row.ms = std::max(row.ms, times[times.size() / 2]);
      row.sent += ledger->total(Tier::kIntraNode).sent + ledger->total(Tier::kInterNode).sent;
      row.inter += ledger->total(Tier::kInterNode).sent;
    });
  }
  for (auto& t : threads) t.join();
  return row;
}

}  // namespace
}  // namespace tandem::comm

int main(int argc, char** argv) {
  using namespace tandem::comm;
  const size_t floats = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t{1} << 22);
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const Timeout t(120000);
  std::printf("%-4s %-28s %10s %14s %14s\n", "N", "operation", "ms", "sent (all)", "inter-node");
  for (int n : {2, 4}) {
    QuantizedExchange* exchanges[4] = {};
    std::vector<std::unique_ptr<QuantizedExchange>> owned;
    for (int r = 0; r < n; ++r) {
      owned.push_back(std::make_unique<QuantizedExchange>(floats, n));
      exchanges[r] = owned.back().get();
    }
    std::vector<std::vector<float>> errors(n, std::vector<float>(floats, 0.f));
    std::vector<std::vector<float>> owner(n, std::vector<float>(floats / n + 1, 0.f));
    std::vector<std::vector<float>> outs(n, std::vector<float>(floats / n + 1));
    std::vector<std::vector<float>> scratch(n, std::vector<float>(floats + 1));
    const std::vector<std::pair<const char*, Op>> ops = {
        {"reduce_scatter fp32",
         [&](int r, Collective& c, NodeCollectives&, std::vector<float>& d) {
           return c.reduce_scatter(d.data(), outs[r].data(), SplitEven(floats, n), t);
         }},
        {"reduce_scatter int4 + EF",
         [&](int r, Collective& c, NodeCollectives&, std::vector<float>& d) {
           return exchanges[r]->ReduceScatter(c, d.data(), errors[r].data(), outs[r].data(), SplitEven(floats, n), t);
         }},
        {"allreduce fp32 (flat ring)",
         [&](int, Collective& c, NodeCollectives&, std::vector<float>& d) {
           return c.allreduce(d.data(), floats, ReduceOp::kSum, t);
         }},
        {"allreduce int4 + EF",
         [&](int r, Collective& c, NodeCollectives&, std::vector<float>& d) {
           return exchanges[r]->Allreduce(c, d.data(), floats, errors[r].data(), owner[r].data(), t);
         }},
        {"allreduce fp32 hierarchical",
         [&](int r, Collective&, NodeCollectives& g, std::vector<float>& d) {
           return HierarchicalAllreduce(g, d.data(), floats, scratch[r].data(), t);
         }},
    };
    for (const auto& [name, op] : ops) {
      const Row row = Measure(n, floats, reps, op);
      std::printf("%-4d %-28s %10.1f %14llu %14llu\n", n, name, row.ms, static_cast<unsigned long long>(row.sent),
                  static_cast<unsigned long long>(row.inter));
    }
  }
  return 0;
}
