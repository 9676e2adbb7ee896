// Blockwise int8 quantisation (kernels/int8_blocks.h) on every backend this
// machine runs (reference, fast CPU, the CUDA kernels on the emulator): the
// wire equals the reference bit for bit, and dequantised values stay within
// half a quantisation step of the input, |x - x'| <= max|x| / 254 per block
// (a relative bound on the block's largest magnitude). The case table
// (op_cases.cc, family int8_blocks) runs the same comparison on cpu-guarded
// and on a real GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/emu/emu_ops.h"
#include "kernels/int8_blocks.h"
#include "kernels/int8_rounding.h"
#include "kernels/ref/quantize_int8_ref.h"

namespace tandem::kernels {
namespace {

std::vector<float> Input(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  // Blocks of very different magnitudes, so a scale that leaks between
  // blocks shows up.
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (i % 300 < 150 ? 1e-3f : 5.f);
  if (n > 600) std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // an all-zero block
  return x;
}

TEST(Int8Blocks, WireSize) {
  EXPECT_EQ(Int8WireFloats(0), 0u);
  EXPECT_EQ(Int8WireFloats(1), 1u + 1u);
  EXPECT_EQ(Int8WireFloats(256), 1u + 64u);
  EXPECT_EQ(Int8WireFloats(257), 2u + 65u);
}

TEST(Int8Blocks, EveryBackendEqualsReferenceWithinHalfAStep) {
  std::vector<std::unique_ptr<Ops>> backends;
  backends.push_back(MakeCpuOps(2));
  backends.push_back(MakeEmuOps());
  const std::unique_ptr<Ops> ref = MakeReferenceOps();
  for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{255}, size_t{256}, size_t{257}, size_t{1000}, size_t{4099},
                   size_t{65537}}) {
    const std::vector<float> x = Input(n, static_cast<uint32_t>(n));
    const size_t w = Int8WireFloats(n);
    std::vector<float> want(w, -1.f), dq(n);
    ref->quantize_int8(x.data(), n, want.data(), kInt8RoundNearest);
    ref->dequantize_int8(want.data(), n, dq.data());
    // The plain functions are what the reference backend runs.
    std::vector<float> plain(w, -3.f);
    ref::quantize_int8(x.data(), n, plain.data(), kInt8RoundNearest);
    ASSERT_EQ(0, std::memcmp(plain.data(), want.data(), w * sizeof(float))) << "n=" << n;
    for (size_t b = 0; b * kInt8Block < n; ++b) {
      const size_t lo = b * kInt8Block, hi = std::min(n, lo + kInt8Block);
      float amax = 0;
      for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = lo; i < hi; ++i) {
        ASSERT_LE(std::fabs(x[i] - dq[i]), amax / 254.f * (1 + 1e-5f)) << "n=" << n << " i=" << i;
      }
    }
    for (auto& ops : backends) {
      std::vector<float> got(w, std::nanf("")), got_dq(n, std::nanf(""));
      ops->quantize_int8(x.data(), n, got.data(), kInt8RoundNearest);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), w * sizeof(float))) << ops->name() << " n=" << n;
      ops->dequantize_int8(want.data(), n, got_dq.data());
      ASSERT_EQ(0, std::memcmp(got_dq.data(), dq.data(), n * sizeof(float))) << ops->name() << " n=" << n;
    }
  }
}

// Exact halves round to even, and codes never pass +-127.
TEST(Int8Blocks, RoundsHalvesToEvenAndClamps) {
  std::vector<float> x = {127.f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -127.f, 126.5f};
  const size_t n = x.size();
  std::vector<float> wire(Int8WireFloats(n));
  std::vector<std::unique_ptr<Ops>> backends;
  backends.push_back(MakeReferenceOps());
  backends.push_back(MakeCpuOps(1));
  backends.push_back(MakeEmuOps());
  for (auto& ops : backends) {
    ops->quantize_int8(x.data(), n, wire.data(), kInt8RoundNearest);
    EXPECT_EQ(wire[0], 1.f) << ops->name();
    const int8_t* codes = reinterpret_cast<const int8_t*>(wire.data() + 1);
    const int8_t expect[] = {127, 0, 2, 2, 0, -2, -127, 126};
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(codes[i], expect[i]) << ops->name() << " i=" << i;
  }
}

// Stochastic rounding: the same bits on every backend for a seed, other
// bits for another seed, and less than one step of error per value.
TEST(Int8Blocks, StochasticEveryBackendEqualsReferenceWithinOneStep) {
  std::vector<std::unique_ptr<Ops>> backends;
  backends.push_back(MakeCpuOps(2));
  backends.push_back(MakeEmuOps());
  const std::unique_ptr<Ops> ref = MakeReferenceOps();
  for (size_t n : {size_t{1}, size_t{3}, size_t{257}, size_t{1000}, size_t{4099}, size_t{65537}}) {
    const std::vector<float> x = Input(n, static_cast<uint32_t>(n) + 7);
    const size_t w = Int8WireFloats(n);
    const uint64_t seed = Int8SeedFrom(42, 3, n, 1);
    std::vector<float> want(w, -1.f), dq(n);
    ref->quantize_int8(x.data(), n, want.data(), seed);
    ref->dequantize_int8(want.data(), n, dq.data());
    for (size_t b = 0; b * kInt8Block < n; ++b) {
      const size_t lo = b * kInt8Block, hi = std::min(n, lo + kInt8Block);
      float amax = 0;
      for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = lo; i < hi; ++i) {
        const float err = std::fabs(x[i] - dq[i]);
        ASSERT_TRUE(err == 0.f || err < amax / 127.f * (1 + 1e-5f)) << "n=" << n << " i=" << i << " err=" << err;
      }
    }
    for (auto& ops : backends) {
      std::vector<float> got(w, std::nanf(""));
      ops->quantize_int8(x.data(), n, got.data(), seed);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), w * sizeof(float))) << ops->name() << " n=" << n;
    }
    if (n >= 1000) {
      std::vector<float> other(w);
      ref->quantize_int8(x.data(), n, other.data(), Int8SeedFrom(42, 4, n, 1));
      EXPECT_NE(0, std::memcmp(other.data(), want.data(), w * sizeof(float))) << "n=" << n;
    }
  }
}

// The mean of the dequantised values over many seeds converges to the
// input: |mean - x| <= 5 standard errors of a draw within one step
// (sigma <= step / 2), plus float slack.
TEST(Int8Blocks, StochasticRoundingIsUnbiased) {
  const size_t n = 512;
  std::vector<float> x(n);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (float& v : x) v = uni(rng);
  x[0] = 1.f;     // block 0: step 1/127
  x[256] = -3.f;  // block 1: step 3/127
  const int kSeeds = 4000;
  std::vector<double> sum(n, 0.0);
  std::vector<float> wire(Int8WireFloats(n)), dq(n);
  const std::unique_ptr<Ops> cpu = MakeCpuOps(1);
  for (int s = 0; s < kSeeds; ++s) {
    cpu->quantize_int8(x.data(), n, wire.data(), Int8SeedFrom(7, static_cast<uint64_t>(s), 0, 0));
    cpu->dequantize_int8(wire.data(), n, dq.data());
    for (size_t i = 0; i < n; ++i) sum[i] += dq[i];
  }
  double worst_bias_steps = 0;
  for (size_t i = 0; i < n; ++i) {
    const double step = (i < 256 ? 1.0 : 3.0) / 127.0;
    const double bias = std::fabs(sum[i] / kSeeds - x[i]);
    EXPECT_LE(bias, 5.0 * 0.5 * step / std::sqrt(static_cast<double>(kSeeds)) + 1e-6) << "i=" << i;
    worst_bias_steps = std::max(worst_bias_steps, bias / step);
  }
  // Round to nearest is off by up to half a step; the stochastic mean is far
  // closer for every value.
  EXPECT_LT(worst_bias_steps, 0.05);
}

}  // namespace
}  // namespace tandem::kernels
