// Multi-rank tests in one process: N ranks as N threads, each with its own
// Gloo Collective, rendezvous over one InMemoryStore, TCP on 127.0.0.1.
//
//   RunRanks(4, [&](comm::Collective& c) { ... c.rank() ... });
//
// Every thread is joined before RunRanks returns. A rank whose Collective
// cannot be made records a GoogleTest failure and returns; the others then
// fail their rendezvous within the options' timeout, so a broken rank never
// hangs the test. End-to-end tests run real processes instead.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"

namespace tandem::testing {

// Gloo on 127.0.0.1 with a rendezvous and operation timeout of `timeout`.
inline comm::CollectiveOptions TestOptions(std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  comm::CollectiveOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Runs fn(rank, collective) on n threads, one rank each; fn owns its
// Collective (to wrap it, e.g. in a guarded collective).
inline void RunRankThreads(int n, const std::function<void(int, std::unique_ptr<comm::Collective>)>& fn,
                           const comm::CollectiveOptions& options = TestOptions()) {
  comm::InMemoryStore store;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = comm::MakeCollective("gloo", store, r, n, options);
      ASSERT_TRUE(c.ok()) << "rank " << r << ": " << c.status();
      fn(r, std::move(*c));
    });
  }
  for (auto& t : threads) t.join();
}

// Runs fn(collective) on n threads, one rank each.
inline void RunRanks(int n, const std::function<void(comm::Collective&)>& fn,
                     const comm::CollectiveOptions& options = TestOptions()) {
  RunRankThreads(
      n, [&](int, std::unique_ptr<comm::Collective> c) { fn(*c); }, options);
}

}  // namespace tandem::testing
