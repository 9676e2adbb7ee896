// Int4 blockwise quantisation and the quantised reduce-scatter / allreduce
// (LoCo) against exact fp32 sums; error feedback against none.
#include <cmath>
#include <mutex>
#include <set>

#include "tests/comm/comm_test_util.h"
#include "worker/comm/quantized_collectives.h"

namespace tandem::comm {
namespace {

using testing::RunRanks;
using testing::Values;
constexpr Timeout kT{20000};

TEST(Int4, RoundTripWithinHalfAStepAndResidualIsExact) {
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}}) {
    auto x = Values(0, n, 1);
    std::vector<float> err(n, 0.f), back(n);
    std::vector<uint8_t> wire(Int4WireBytes(n));
    QuantizeInt4(x.data(), err.data(), n, wire.data());
    DequantizeInt4(wire.data(), n, back.data());
    for (size_t b = 0; b * kInt4Block < n; ++b) {
      float amax = 0;
      const size_t end = std::min(n, (b + 1) * kInt4Block);
      for (size_t i = b * kInt4Block; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = b * kInt4Block; i < end; ++i) {
        EXPECT_LE(std::fabs(back[i] - x[i]), amax / 14 * (1 + 1e-5f)) << i;
        EXPECT_NEAR(err[i], x[i] - back[i], 1e-6f) << i;
      }
    }
  }
  EXPECT_EQ(Int4WireBytes(128), 64u + 8u);  // 1/8 of fp32 plus 2 scales
  std::vector<float> zeros(10, 0.f), out(10, 1.f);
  std::vector<uint8_t> wire(Int4WireBytes(10));
  QuantizeInt4(zeros.data(), nullptr, 10, wire.data());
  DequantizeInt4(wire.data(), 10, out.data());
  for (float v : out) EXPECT_EQ(v, 0.f);
}

TEST(RoundRobin, EveryPairMeetsOnceInDisjointRounds) {
  for (int world = 1; world <= 7; ++world) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < RoundRobinRounds(world); ++round) {
      for (int r = 0; r < world; ++r) {
        const int p = RoundRobinPartner(world, round, r);
        if (p < 0) continue;
        ASSERT_NE(p, r);
        ASSERT_EQ(RoundRobinPartner(world, round, p), r) << world << " " << round;
        if (r < p) EXPECT_TRUE(met.insert({r, p}).second) << world;
      }
    }
    EXPECT_EQ(met.size(), static_cast<size_t>(world * (world - 1) / 2)) << world;
  }
}

// Reduce-scatter of uneven pieces: within the quantisation bound of the exact
// sum; bytes sent are the int4 pieces for the other ranks.
TEST(QuantizedExchange, ReduceScatterNearExactSum) {
  for (int n : {2, 3, 4}) {
    const std::vector<size_t> counts = {1000, 7, 0, 333};
    std::vector<size_t> c(counts.begin(), counts.begin() + n);
    size_t total = 0;
    for (size_t x : c) total += x;
    RunRanks(n, [&](Collective& comm) {
      const int r = comm.rank();
      QuantizedExchange ex(total, n);
      auto in = Values(r, total, 5);
      std::vector<float> out(c[r] + 1);
      ASSERT_TRUE(ex.ReduceScatter(comm, in.data(), nullptr, out.data(), c, kT).ok());
      size_t off = 0;
      for (int j = 0; j < r; ++j) off += c[j];
      for (size_t i = 0; i < c[r]; ++i) {
        double exact = 0;
        for (int j = 0; j < n; ++j) exact += Values(j, total, 5)[off + i];
        EXPECT_NEAR(out[i], exact, (n - 1) * 1.0 / 14 + 1e-5) << "rank " << r << " i " << i;
      }
      uint64_t expect_sent = 0;
      for (int j = 0; j < n; ++j) {
        if (j != r && c[j] > 0) expect_sent += Int4WireBytes(c[j]);
      }
      EXPECT_EQ(comm.bytes(CollectiveKind::kSendRecv).sent, expect_sent);
    });
  }
}

// The same input K times: with error feedback the summed outputs stay within
// one quantisation step of K * exact; without it the rounding bias grows
// with K.
TEST(QuantizedExchange, ErrorFeedbackKeepsTheRunningSumExact) {
  const int n = 2, calls = 50;
  const size_t total = 256;
  std::mutex mu;
  double worst_feedback = 0, worst_plain = 0;
  RunRanks(n, [&](Collective& comm) {
    const int r = comm.rank();
    QuantizedExchange ex(total, n);
    auto in = Values(r, total, 9);
    std::vector<float> err(total, 0.f), out(total / 2), sum_fb(total / 2, 0.f), sum_plain(total / 2, 0.f);
    const std::vector<size_t> c = {total / 2, total / 2};
    for (int k = 0; k < calls; ++k) {
      ASSERT_TRUE(ex.ReduceScatter(comm, in.data(), err.data(), out.data(), c, kT).ok());
      for (size_t i = 0; i < out.size(); ++i) sum_fb[i] += out[i];
      ASSERT_TRUE(ex.ReduceScatter(comm, in.data(), nullptr, out.data(), c, kT).ok());
      for (size_t i = 0; i < out.size(); ++i) sum_plain[i] += out[i];
    }
    double fb = 0, plain = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double exact =
          calls * (double(Values(0, total, 9)[r * total / 2 + i]) + double(Values(1, total, 9)[r * total / 2 + i]));
      fb = std::max(fb, std::fabs(sum_fb[i] - exact));
      plain = std::max(plain, std::fabs(sum_plain[i] - exact));
    }
    std::lock_guard<std::mutex> lock(mu);
    worst_feedback = std::max(worst_feedback, fb);
    worst_plain = std::max(worst_plain, plain);
  });
  EXPECT_LT(worst_feedback, 0.1);  // one step of 1/7 at most
  EXPECT_GT(worst_plain, 10 * worst_feedback);
}

TEST(QuantizedExchange, AllreduceGivesEveryRankTheSameNearExactSum) {
  for (int n : {1, 2, 3}) {
    const size_t len = 1001;
    std::mutex mu;
    std::vector<std::vector<float>> results(n);
    RunRanks(n, [&](Collective& comm) {
      const int r = comm.rank();
      QuantizedExchange ex(len, n);
      auto data = Values(r, len, 2);
      std::vector<float> err(len, 0.f), owner_err(len / n + 1, 0.f);
      ASSERT_TRUE(ex.Allreduce(comm, data.data(), len, err.data(), owner_err.data(), kT).ok());
      std::lock_guard<std::mutex> lock(mu);
      results[r] = data;
    });
    for (size_t i = 0; i < len; ++i) {
      double exact = 0;
      for (int j = 0; j < n; ++j) exact += Values(j, len, 2)[i];
      ASSERT_NEAR(results[0][i], exact, n == 1 ? 0 : n * 1.0 / 14 + n / 14.0 + 1e-5) << i;
      for (int j = 1; j < n; ++j) ASSERT_EQ(results[j][i], results[0][i]) << i;
    }
  }
}

}  // namespace
}  // namespace tandem::comm
