// Helpers of the comm tests: the ranks-as-threads runner and per-rank data.
#pragma once

#include <random>
#include <vector>

#include "tests/support/run_ranks.h"

namespace tandem::comm::testing {

// N ranks as N threads over one store: tests/support/run_ranks.h.
using ::tandem::testing::RunRanks;
using ::tandem::testing::TestOptions;

// Deterministic per-(rank, i) values.
inline std::vector<float> Values(int rank, size_t n, int salt = 0) {
  std::vector<float> v(n);
  std::mt19937 gen(rank * 7919 + salt * 104729 + 1);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace tandem::comm::testing
