// Regressions in layers the engine builds on, found by the engine tests and
// reproduced here directly (owners: worker/comm, worker/zero).
#include <gtest/gtest.h>

#include <random>

#include "tests/support/run_ranks.h"
#include "worker/comm/collective.h"

namespace tandem::enginetest {
namespace {

std::vector<float> Values(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  std::mt19937 gen(rank * 7919 + salt * 104729 + 1);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : v) x = d(gen);
  return v;
}

// Repeated reduce-scatters with uneven counts on 3 ranks, as ZeRO stage 2/3
// issues them (one per model unit, many per step, mixed with allgathers).
TEST(CommRegressionTest, RepeatedUnevenReduceScatterThreeRanks) {
  constexpr int kRanks = 3;
  const std::vector<size_t> sizes = {3168, 32, 1024, 512, 2048, 32, 3168, 7, 1024, 2048};
  std::vector<int> bad(kRanks, 0);
  testing::RunRanks(kRanks, [&](comm::Collective& c) {
    const int r = c.rank();
    for (int round = 0; round < 4; ++round) {
      for (size_t u = 0; u < sizes.size(); ++u) {
        const size_t n = sizes[u];
        std::vector<size_t> counts(kRanks, n / kRanks);
        for (size_t i = 0; i < n % kRanks; ++i) counts[i]++;
        const int salt = round * 100 + static_cast<int>(u);
        auto in = Values(r, n, salt);
        std::vector<float> out(counts[r]);
        ASSERT_TRUE(c.reduce_scatter(in.data(), out.data(), counts, std::chrono::milliseconds(20000)).ok());
        size_t off = 0;
        for (int q = 0; q < r; ++q) off += counts[q];
        std::vector<float> want(counts[r], 0.f);
        for (int q = 0; q < kRanks; ++q) {
          auto v = Values(q, n, salt);
          for (size_t i = 0; i < counts[r]; ++i) want[i] += v[off + i];
        }
        for (size_t i = 0; i < counts[r]; ++i) {
          if (std::fabs(out[i] - want[i]) > 1e-5f) {
            bad[r]++;
            break;
          }
        }
      }
    }
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r << " wrong sums";
}

}  // namespace
}  // namespace tandem::enginetest
