// Ops::sample_logits: the CPU backend and the guarded wrapper equal the
// reference bit for bit; the draws follow softmax(logits / T) (an even grid
// of uniforms reproduces the probabilities); greedy takes the lowest id of
// a tie; both log-probs match a double-precision softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backends.h"
#include "kernels/guarded/guarded_memory.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

struct Draws {
  std::vector<int32_t> ids;
  std::vector<float> lp, raw;
};

Draws Sample(Ops& ops, const std::vector<float>& logits, int v, float t, const std::vector<double>& u) {
  const int rows = static_cast<int>(u.size());
  Draws d{std::vector<int32_t>(rows), std::vector<float>(rows), std::vector<float>(rows)};
  ops.sample_logits(logits.data(), rows, v, t, u.data(), d.ids.data(), d.lp.data(), d.raw.data());
  return d;
}

std::vector<double> Uniforms(int n, uint64_t seed) {
  auto f = testing::RandomVec<double>(n, seed, 0.0, 1.0);
  return f;
}

TEST(SampleLogitsTest, CpuAndGuardedEqualReferenceBitForBit) {
  auto ref = MakeReferenceOps();
  auto cpu = MakeCpuOps(2);
  auto mem = MakeGuardedMemory(size_t{64} << 20);
  auto guarded = MakeGuardedOps(MakeCpuOps(1), mem.get());
  for (int v : {1, 5, 999}) {
    for (float t : {0.f, 0.6f, 1.f, 2.5f}) {
      const int rows = 37;
      auto logits = testing::RandomVec(size_t(rows) * v, 100 + v, -6.0, 6.0);
      auto u = Uniforms(rows, 7 + v);
      const Draws want = Sample(*ref, logits, v, t, u);
      const Draws got = Sample(*cpu, logits, v, t, u);
      EXPECT_EQ(got.ids, want.ids) << "v " << v << " T " << t;
      EXPECT_EQ(std::memcmp(got.lp.data(), want.lp.data(), rows * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got.raw.data(), want.raw.data(), rows * sizeof(float)), 0);
      // Through guarded device memory.
      DeviceArray<float> dl, dlp, draw;
      DeviceArray<double> du;
      DeviceArray<int32_t> did;
      ASSERT_TRUE(dl.Allocate(mem.get(), logits.size()) && du.Allocate(mem.get(), rows) &&
                  did.Allocate(mem.get(), rows) && dlp.Allocate(mem.get(), rows) && draw.Allocate(mem.get(), rows));
      dl.Upload(logits.data(), logits.size());
      du.Upload(u.data(), rows);
      guarded->sample_logits(dl.data(), rows, v, t, du.data(), did.data(), dlp.data(), draw.data());
      std::vector<int32_t> gid(rows);
      did.Download(gid.data(), rows);
      EXPECT_EQ(gid, want.ids);
    }
  }
}

TEST(SampleLogitsTest, DrawsFollowTheTemperedSoftmax) {
  auto cpu = MakeCpuOps(1);
  const std::vector<float> row = {1.0f, -0.5f, 2.0f, 0.3f, 2.0f};
  const int v = static_cast<int>(row.size());
  for (float t : {0.5f, 1.f, 3.f}) {
    // An even grid of uniforms: each token's share is its probability.
    const int n = 20000;
    std::vector<double> u(n);
    for (int i = 0; i < n; ++i) u[i] = (i + 0.5) / n;
    std::vector<float> logits;
    for (int i = 0; i < n; ++i) logits.insert(logits.end(), row.begin(), row.end());
    const Draws d = Sample(*cpu, logits, v, t, u);
    double z = 0, z1 = 0;
    for (float l : row) {
      z += std::exp(l / double(t));
      z1 += std::exp(double(l));
    }
    std::vector<int> count(v, 0);
    for (int i = 0; i < n; ++i) {
      ++count[d.ids[i]];
      const double p = std::exp(row[d.ids[i]] / double(t)) / z;
      EXPECT_NEAR(d.lp[i], std::log(p), 1e-6);
      EXPECT_NEAR(d.raw[i], row[d.ids[i]] - std::log(z1), 1e-6);
    }
    for (int k = 0; k < v; ++k) {
      const double p = std::exp(row[k] / double(t)) / z;
      EXPECT_NEAR(count[k] / double(n), p, 1.0 / n + 1e-9) << "token " << k << " T " << t;
    }
  }
}

TEST(SampleLogitsTest, GreedyTakesTheLowestIdOfATie) {
  auto cpu = MakeCpuOps(1);
  const std::vector<float> logits = {0.f, 3.f, -1.f, 3.f};
  const Draws d = Sample(*cpu, logits, 4, 0.f, {0.9});
  EXPECT_EQ(d.ids[0], 1);
  EXPECT_EQ(d.lp[0], 0.f);
  EXPECT_NEAR(d.raw[0], 3.0 - std::log(1 + 2 * std::exp(3.0) + std::exp(-1.0)), 1e-6);
}

}  // namespace
}  // namespace tandem::kernels
