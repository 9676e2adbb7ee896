// fp32 <-> bf16 conversion of the op backends (kernels/bf16.h rules) against
// a plain reference that rounds by comparing distances in double: round to
// nearest, ties to even, overflow to Inf, NaN stays NaN, Inf stays Inf,
// denormals kept. Reference and fast CPU backends must give the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Value of a bf16 bit pattern from its fields (no bit shifting into fp32).
double Bf16Value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
  double v;
  if (exp == 0) {
    v = std::ldexp(man / 128.0, -126);  // denormal
  } else if (exp == 255) {
    v = man == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(1.0 + man / 128.0, exp - 127);
  }
  return sign ? -v : v;
}

// Plain round-to-nearest-even by distance; NaN handled by the caller.
uint16_t PlainRound(float x) {
  if (std::isinf(x)) return x > 0 ? 0x7f80 : 0xff80;
  const uint16_t t = static_cast<uint16_t>(Bits(x) >> 16);  // toward zero
  const double a = std::fabs(static_cast<double>(x));
  const double lo = std::fabs(Bf16Value(t));
  // The next bf16 up in magnitude; past the largest finite one IEEE
  // rounding treats the overflow threshold as 2^128.
  const double hi = (t & 0x7fff) == 0x7f7f ? std::ldexp(1.0, 128) : std::fabs(Bf16Value(t + 1));
  const double dlo = a - lo, dhi = hi - a;
  if (dlo < dhi) return t;
  if (dhi < dlo) return t + 1;
  return (t & 1) ? t + 1 : t;  // tie: the even mantissa
}

std::vector<float> Inputs() {
  std::vector<float> v;
  // Every bf16 value, the midpoints to the next one and their neighbours.
  for (uint32_t h = 0; h < 0x10000; h += 1) {
    const uint32_t b = h << 16;
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      v.push_back(FromBits(b | low));
    }
  }
  // A strided sweep of all 2^32 patterns and random ones.
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 65521) {
    v.push_back(FromBits(static_cast<uint32_t>(b)));
  }
  std::mt19937 gen(7);
  for (int i = 0; i < 100000; ++i) v.push_back(FromBits(gen()));
  return v;
}

void CheckBackend(Ops& ops) {
  const std::vector<float> x = Inputs();
  std::vector<uint16_t> y(x.size());
  ops.float_to_bf16(x.data(), y.data(), x.size());
  size_t nans = 0, infs = 0, denormals = 0, ties = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t b = Bits(x[i]);
    if (std::isnan(x[i])) {
      ++nans;
      ASSERT_TRUE(std::isnan(Bf16Value(y[i]))) << std::hex << b << " -> " << y[i];
      ASSERT_EQ(y[i] >> 15, b >> 31) << "NaN sign";
      continue;
    }
    infs += std::isinf(x[i]) || std::isinf(Bf16Value(y[i]));
    denormals += std::fpclassify(x[i]) == FP_SUBNORMAL;
    ties += (b & 0xffff) == 0x8000;
    ASSERT_EQ(y[i], PlainRound(x[i])) << ops.name() << ": " << std::hex << b << " (" << x[i] << ")";
  }
  EXPECT_GT(nans, 100u);
  EXPECT_GT(infs, 10u);
  EXPECT_GT(denormals, 1000u);
  EXPECT_GT(ties, 60000u);

  // bf16 -> fp32 is exact: every pattern.
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> w(all.size());
  ops.bf16_to_float(all.data(), w.data(), all.size());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double want = Bf16Value(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(w[h])) << h;
      ASSERT_EQ(Bits(w[h]), h << 16) << "NaN payload kept";
    } else {
      ASSERT_EQ(static_cast<double>(w[h]), want) << std::hex << h;
      ASSERT_EQ(std::signbit(w[h]), (h >> 15) != 0) << std::hex << h;
    }
  }
  // Round trip: bf16 values survive fp32 -> bf16 unchanged.
  std::vector<uint16_t> back(all.size());
  ops.float_to_bf16(w.data(), back.data(), w.size());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7fff) > 0x7f80 && (h & 0x0040) == 0) {
      EXPECT_EQ(back[h], h | 0x0040) << "signalling NaN becomes quiet";
    } else {
      ASSERT_EQ(back[h], h) << std::hex << h;
    }
  }
}

TEST(Bf16Convert, ReferenceBackend) {
  auto ops = MakeReferenceOps();
  CheckBackend(*ops);
}

TEST(Bf16Convert, CpuBackend) {
  auto ops = MakeCpuOps(2);
  CheckBackend(*ops);
}

TEST(Bf16Convert, NamedCases) {
  auto ops = MakeReferenceOps();
  const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000u, 0x3f80},  // 1.0 exact
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: tie, even stays
      {0x3f818000u, 0x3f82},  // 1 + 3*2^-8: tie, odd rounds up
      {0x3f808001u, 0x3f81},  // just above the tie
      {0xbf808001u, 0xbf81},  // negative: magnitude rounds the same
      {0x7f7fffffu, 0x7f80},  // FLT_MAX overflows to Inf
      {0x7f7f7fffu, 0x7f7f},  // below the overflow threshold
      {0x7f800000u, 0x7f80},  // +Inf
      {0xff800000u, 0xff80},  // -Inf
      {0x7f800001u, 0x7fc0},  // NaN with low payload: stays NaN (quiet)
      {0xffc00000u, 0xffc0},  // negative quiet NaN
      {0x00000001u, 0x0000},  // smallest denormal rounds to +0
      {0x80000001u, 0x8000},  // ... and to -0
      {0x00008000u, 0x0000},  // denormal tie to even (0)
      {0x00018000u, 0x0002},  // denormal tie to even (2)
      {0x007fffffu, 0x0080},  // largest denormal rounds up to FLT_MIN
      {0x80000000u, 0x8000},  // -0 keeps its sign
  };
  for (const auto& c : cases) {
    const float x = FromBits(c.in);
    uint16_t y = 0;
    ops->float_to_bf16(&x, &y, 1);
    EXPECT_EQ(y, c.out) << std::hex << c.in;
  }
}

}  // namespace
}  // namespace tandem::kernels
