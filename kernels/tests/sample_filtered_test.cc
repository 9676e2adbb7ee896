// Ops::sample_filtered: the CPU backend and the guarded wrapper equal the
// reference (kernels/sample_filter_row.h) bit for bit and the CUDA kernel
// under the emulator draws the same ids with log-probs within fp32
// reduction error, over random rows with every filter; degenerate filters
// are greedy; ties are taken lowest id first; a repeated seen id is
// penalised once; the draws follow the filtered distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/emu/emu_ops.h"
#include "kernels/guarded/guarded_memory.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

struct Draws {
  std::vector<int32_t> ids;
  std::vector<float> lp, raw;
};

// Host pointers (CPU backends and the emulator).
Draws Sample(Ops& ops, const std::vector<float>& logits, int v, const SampleFilter& f, const std::vector<double>& u,
             const std::vector<int32_t>& offsets = {}, const std::vector<int32_t>& seen = {}) {
  const int rows = static_cast<int>(u.size());
  Draws d{std::vector<int32_t>(rows, -7), std::vector<float>(rows, NAN), std::vector<float>(rows, NAN)};
  ops.sample_filtered(logits.data(), rows, v, f, offsets.empty() ? nullptr : offsets.data(),
                      offsets.empty() ? nullptr : seen.data(), u.data(), d.ids.data(), d.lp.data(), d.raw.data());
  return d;
}

// Seen lists with repeats and ids outside [0, v).
void SeenLists(int rows, int v, uint64_t seed, std::vector<int32_t>* offsets, std::vector<int32_t>* seen) {
  std::mt19937_64 rng(seed);
  offsets->assign(1, 0);
  seen->clear();
  for (int r = 0; r < rows; ++r) {
    const int n = static_cast<int>(rng() % 30);
    for (int j = 0; j < n; ++j) {
      const uint64_t x = rng() % 12;
      seen->push_back(x == 0 ? -3 : x == 1 ? v : static_cast<int32_t>(rng() % std::min<uint64_t>(v, 64)));
    }
    offsets->push_back(static_cast<int32_t>(seen->size()));
  }
}

const SampleFilter kCombos[] = {
    {0.8f, 20, 0.9f, 0.05f, 1.3f},  // all on
    {1.f, 0, 1.f, 0.f, 1.f},        // none
    {1.f, 1, 1.f, 0.f, 1.f},        // top-k 1
    {1.3f, 0, 0.5f, 0.f, 1.f},      // top-p
    {0.6f, 0, 1.f, 0.2f, 1.f},      // min-p
    {0.f, 0, 1.f, 0.f, 1.7f},       // greedy with penalty
    {1.f, 7, 1.f, 0.f, 0.8f},       // top-k, penalty below 1
    {2.f, 0, 1e-6f, 0.f, 1.f},      // tiny top-p
    {1.f, 0, 1.f, 0.999f, 1.f},     // min-p near 1
};

TEST(SampleFilteredTest, CpuGuardedAndEmulatorEqualTheReference) {
  auto ref = MakeReferenceOps();
  auto cpu = MakeCpuOps(2);
  auto emu = MakeEmuOps();
  auto mem = MakeGuardedMemory(size_t{64} << 20);
  auto guarded = MakeGuardedOps(MakeCpuOps(1), mem.get());
  uint64_t seed = 1;
  for (int v : {1, 3, 64, 1000, 4099}) {
    for (const SampleFilter& f : kCombos) {
      SCOPED_TRACE(::testing::Message() << "v " << v << " T " << f.temperature << " k " << f.top_k << " p " << f.top_p
                                        << " min_p " << f.min_p << " pen " << f.repetition_penalty);
      const int rows = v > 1000 ? 8 : 48;
      auto logits = testing::RandomVec(size_t(rows) * v, seed, -5.0, 5.0);
      // Row 1 on a 0.5 grid (many ties), row 2 all equal.
      for (int i = 0; i < v && rows > 2; ++i) {
        logits[size_t(v) + i] = std::round(logits[size_t(v) + i] * 2) / 2;
        logits[size_t(2) * v + i] = 1.5f;
      }
      auto u = testing::RandomVec<double>(rows, seed + 1, 0.0, 1.0);
      u[0] = 0.0;
      std::vector<int32_t> offsets, seen;
      SeenLists(rows, v, seed + 2, &offsets, &seen);
      seed += 3;
      const Draws want = Sample(*ref, logits, v, f, u, offsets, seen);
      const Draws got = Sample(*cpu, logits, v, f, u, offsets, seen);
      EXPECT_EQ(got.ids, want.ids);
      EXPECT_EQ(std::memcmp(got.lp.data(), want.lp.data(), rows * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(got.raw.data(), want.raw.data(), rows * sizeof(float)), 0);
      // The emulator (slow: a fiber per thread) on the first rows: u = 0,
      // the tie rows and random ones.
      const int er = std::min(rows, 5);
      const std::vector<float> elogits(logits.begin(), logits.begin() + size_t(er) * v);
      const std::vector<double> eu(u.begin(), u.begin() + er);
      const std::vector<int32_t> eoff(offsets.begin(), offsets.begin() + er + 1);
      const Draws e = Sample(*emu, elogits, v, f, eu, eoff, seen);
      EXPECT_EQ(e.ids, std::vector<int32_t>(want.ids.begin(), want.ids.begin() + er));
      for (int r = 0; r < er; ++r) {
        EXPECT_NEAR(e.lp[r], want.lp[r], 1e-5 * (1 + std::fabs(want.lp[r]))) << "row " << r;
        EXPECT_NEAR(e.raw[r], want.raw[r], 1e-5 * (1 + std::fabs(want.raw[r]))) << "row " << r;
      }
      // Through guarded device memory.
      DeviceArray<float> dl, dlp, draw;
      DeviceArray<double> du;
      DeviceArray<int32_t> did, doff, dseen;
      ASSERT_TRUE(dl.Allocate(mem.get(), logits.size()) && du.Allocate(mem.get(), rows) &&
                  did.Allocate(mem.get(), rows) && dlp.Allocate(mem.get(), rows) && draw.Allocate(mem.get(), rows) &&
                  doff.Allocate(mem.get(), offsets.size()) &&
                  dseen.Allocate(mem.get(), std::max<size_t>(1, seen.size())));
      dl.Upload(logits.data(), logits.size());
      du.Upload(u.data(), rows);
      doff.Upload(offsets.data(), offsets.size());
      dseen.Upload(seen.data(), seen.size());
      guarded->sample_filtered(dl.data(), rows, v, f, doff.data(), dseen.data(), du.data(), did.data(), dlp.data(),
                               draw.data());
      std::vector<int32_t> gid(rows);
      did.Download(gid.data(), rows);
      EXPECT_EQ(gid, want.ids);
    }
  }
}

TEST(SampleFilteredTest, DegenerateFiltersAreGreedy) {
  auto ref = MakeReferenceOps();
  auto emu = MakeEmuOps();
  const int v = 777, rows = 6;
  auto logits = testing::RandomVec(size_t(rows) * v, 5, -9.0, 9.0);
  auto u = testing::RandomVec<double>(rows, 6, 0.0, 1.0);
  const SampleFilter greedy{0.f, 0, 1.f, 0.f, 1.f};
  for (const SampleFilter& f : {SampleFilter{1.f, 1, 1.f, 0.f, 1.f}, SampleFilter{1.f, 0, 1e-7f, 0.f, 1.f},
                                SampleFilter{1.f, 0, 1.f, 0.9999f, 1.f}}) {
    for (Ops* ops : {ref.get(), emu.get()}) {
      const Draws g = Sample(*ops, logits, v, greedy, u);
      const Draws d = Sample(*ops, logits, v, f, u);
      EXPECT_EQ(d.ids, g.ids) << ops->name();
      for (int r = 0; r < rows; ++r) EXPECT_EQ(d.lp[r], 0.f);  // log(1 / 1)
    }
  }
}

TEST(SampleFilteredTest, TiesAreTakenLowestIdFirst) {
  auto ref = MakeReferenceOps();
  auto emu = MakeEmuOps();
  const std::vector<float> row = {1.f, 3.f, 3.f, 0.f, 3.f, -0.f};
  const int v = static_cast<int>(row.size());
  for (Ops* ops : {ref.get(), emu.get()}) {
    // top-k 2 keeps ids 1 and 2 (not 4), each with probability 1/2.
    const Draws d = Sample(*ops, {row.begin(), row.end()}, v, {1.f, 2, 1.f, 0.f, 1.f}, {0.25});
    EXPECT_EQ(d.ids[0], 1) << ops->name();
    std::vector<float> two(row);
    two.insert(two.end(), row.begin(), row.end());
    const Draws e = Sample(*ops, two, v, {1.f, 2, 1.f, 0.f, 1.f}, {0.25, 0.75});
    EXPECT_EQ(e.ids, (std::vector<int32_t>{1, 2})) << ops->name();
    EXPECT_NEAR(e.lp[1], std::log(0.5), 1e-6);
    // -0 ties with +0: of ids 3 (-0) and 5 (+0) the lowest comes first.
    std::vector<float> zeros = {-1.f, -2.f, -3.f, -0.f, -4.f, 0.f};
    const Draws z = Sample(*ops, zeros, v, {1.f, 1, 1.f, 0.f, 1.f}, {0.5});
    EXPECT_EQ(z.ids[0], 3) << ops->name();
  }
}

TEST(SampleFilteredTest, RepeatedSeenIdsArePenalisedOnce) {
  auto ref = MakeReferenceOps();
  auto emu = MakeEmuOps();
  const std::vector<float> row = {2.f, 1.f, -1.f};
  const std::vector<int32_t> offsets = {0, 5};
  const std::vector<int32_t> seen = {0, 0, 0, 2, 9};  // 9 is outside the vocabulary
  for (Ops* ops : {ref.get(), emu.get()}) {
    // z = {0.5, 1, -4}: greedy takes id 1.
    const Draws g = Sample(*ops, row, 3, {0.f, 0, 1.f, 0.f, 4.f}, {0.3}, offsets, seen);
    EXPECT_EQ(g.ids[0], 1) << ops->name();
    EXPECT_NEAR(g.raw[0], 1.0 - std::log(std::exp(2.0) + std::exp(1.0) + std::exp(-1.0)), 1e-6);
    // Sampling: order 1, 0, 2 with p = exp(z - 1); u just above p_1's share.
    const double z = 1 + std::exp(-0.5) + std::exp(-5.0);
    const Draws s = Sample(*ops, row, 3, {1.f, 0, 1.f, 0.f, 4.f}, {1.0 / z + 1e-9}, offsets, seen);
    EXPECT_EQ(s.ids[0], 0) << ops->name();
    EXPECT_NEAR(s.lp[0], -0.5 - std::log(z), 1e-6);
  }
}

TEST(SampleFilteredTest, DrawsFollowTheFilteredDistribution) {
  auto ref = MakeReferenceOps();
  auto emu = MakeEmuOps();
  const std::vector<float> row = {1.0f, -0.5f, 2.0f, 0.3f, 1.8f, -3.f, 0.9f};
  const int v = static_cast<int>(row.size());
  const SampleFilter f{0.7f, 5, 0.9f, 0.1f, 1.f};
  // Expected: sort, keep the top 5, the top-p prefix, the min-p prefix.
  std::vector<int> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  std::vector<double> p;
  for (int i = 0; i < 5; ++i) p.push_back(std::exp((row[order[i]] - row[order[0]]) / 0.7));
  const double total5 = std::accumulate(p.begin(), p.end(), 0.0);
  size_t keep = 0;
  for (double cum = 0; keep < p.size();) {
    cum += p[keep++] / total5;
    if (cum >= 0.9) break;
  }
  while (keep > 1 && p[keep - 1] < 0.1) --keep;
  p.resize(keep);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  // An even grid of n uniforms: each kept token's share is its probability
  // within 1 / n (a coarser grid under the emulator).
  for (Ops* ops : {ref.get(), emu.get()}) {
    const int n = ops == emu.get() ? 100 : 2000;
    std::vector<double> u(n);
    std::vector<float> logits;
    for (int i = 0; i < n; ++i) {
      u[i] = (i + 0.5) / n;
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const Draws d = Sample(*ops, logits, v, f, u);
    std::vector<int> count(v, 0);
    for (int i = 0; i < n; ++i) ++count[d.ids[i]];
    for (int k = 0; k < v; ++k) {
      const auto at = std::find(order.begin(), order.end(), k) - order.begin();
      const double want = static_cast<size_t>(at) < keep ? p[at] / total : 0.0;
      EXPECT_NEAR(count[k] / double(n), want, 1.0 / n + 1e-9) << "token " << k << " " << ops->name();
    }
  }
}

}  // namespace
}  // namespace tandem::kernels
