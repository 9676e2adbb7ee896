// Test helpers: run N ranks as N threads over one InMemoryStore.
#pragma once

#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/collective.h"

namespace tandem::comm::testing {

inline CollectiveOptions TestOptions(std::chrono::milliseconds timeout =
                                         std::chrono::milliseconds(20000)) {
  CollectiveOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Runs fn(collective) on `n` threads, one rank each.
inline void RunRanks(int n, const std::function<void(Collective&)>& fn) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = MakeCollective("gloo", store, r, n, TestOptions());
      ASSERT_TRUE(c.ok()) << c.status();
      fn(**c);
    });
  }
  for (auto& t : threads) t.join();
}

// Deterministic per-(rank, i) values.
inline std::vector<float> Values(int rank, size_t n, int salt = 0) {
  std::vector<float> v(n);
  std::mt19937 gen(rank * 7919 + salt * 104729 + 1);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace tandem::comm::testing
