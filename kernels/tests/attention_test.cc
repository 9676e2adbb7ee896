// Fast CPU attention (kernels/cpu/attention_cpu.h): properties the case
// table (kernels/tests/op_cases.cc, run by kernels_ops_test) does not cover.
// Rows past the packed tokens get zero gradients; decode attention over a
// cache equals the forward rows of the same tokens (cache slots past
// cache_len hold NaN and must never be read). Error measure:
// max |fast - ref| / max |ref| <= 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backends.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/ref/attention_ref.h"

namespace tandem::kernels {
namespace {

constexpr double kTol = 1e-5;

double RelErr(const std::vector<float>& got, const std::vector<float>& want, size_t n) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - double(want[i])));
    ref = std::max(ref, std::fabs(double(want[i])));
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
  }
  return ref > 0 ? diff / ref : diff;
}

void Fill(std::vector<float>& x, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> nd(0.f, stddev);
  for (float& e : x) e = nd(rng);
}

struct Case {
  std::vector<int> lengths;
  int h, hkv, d;
  bool causal;
  int window;
  float scale = 0.f;
};

struct Buffers {
  int t = 0;
  std::vector<int32_t> cu;
  std::vector<float> q, k, v, dout;
};

Buffers MakeInputs(const Case& c, uint32_t seed) {
  Buffers b;
  b.cu.push_back(0);
  for (int l : c.lengths) b.cu.push_back(b.cu.back() + l);
  b.t = b.cu.back();
  std::mt19937 rng(seed);
  b.q.resize(size_t(b.t) * c.h * c.d);
  b.k.resize(size_t(b.t) * c.hkv * c.d);
  b.v.resize(b.k.size());
  b.dout.resize(b.q.size());
  Fill(b.q, rng, 1.5f);
  Fill(b.k, rng, 1.5f);
  Fill(b.v, rng, 1.f);
  Fill(b.dout, rng, 1.f);
  return b;
}

AttentionParams Params(const Case& c) {
  AttentionParams p;
  p.num_heads = c.h;
  p.num_kv_heads = c.hkv;
  p.head_dim = c.d;
  p.causal = c.causal;
  p.window = c.window;
  p.scale = c.scale;
  return p;
}

TEST(AttentionCpu, PaddingRowsGetZeroGradients) {
  // t larger than the packed tokens: the extra rows' gradients are zero.
  Case c{{10, 20}, 4, 2, 32, true, -1};
  Buffers in = MakeInputs(c, 99);
  const int t = in.t + 3;
  in.q.resize(size_t(t) * c.h * c.d, 0.f);
  in.k.resize(size_t(t) * c.hkv * c.d, 0.f);
  in.v.resize(in.k.size(), 0.f);
  in.dout.resize(in.q.size(), 0.f);
  const AttentionParams p = Params(c);
  std::vector<float> out(in.q.size()), lse(size_t(t) * c.h);
  std::vector<float> dq(in.q.size(), NAN), dk(in.k.size(), NAN), dv(in.k.size(), NAN);
  cpu::attention_forward(p, in.q.data(), in.k.data(), in.v.data(), in.cu.data(), 2, t, out.data(), lse.data());
  cpu::attention_backward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), in.dout.data(), lse.data(),
                          in.cu.data(), 2, t, dq.data(), dk.data(), dv.data());
  for (size_t i = size_t(in.t) * c.h * c.d; i < dq.size(); ++i) ASSERT_EQ(dq[i], 0.f);
  for (size_t i = size_t(in.t) * c.hkv * c.d; i < dk.size(); ++i) {
    ASSERT_EQ(dk[i], 0.f);
    ASSERT_EQ(dv[i], 0.f);
  }
}

// Decode: q of the last n_new tokens against a cache holding the whole
// sequence equals the forward rows of those tokens. Cache slots past
// cache_len hold NaN (they must never be read).
TEST(AttentionCpu, DecodeMatchesForwardRows) {
  SetCpuThreads(2);
  struct DecodeCase {
    std::vector<int> lens;
    int n_new, h, hkv, d, window;
  };
  const std::vector<DecodeCase> cases = {
      {{1, 17, 70, 130}, 1, 8, 2, 64, -1}, {{3, 64, 129}, 3, 4, 4, 32, -1}, {{40, 100}, 2, 8, 1, 128, 16},
      {{5, 200}, 4, 16, 2, 64, 100},       {{66}, 1, 2, 1, 20, 1},
  };
  uint32_t seed = 7;
  for (const DecodeCase& dc : cases) {
    const int cap = *std::max_element(dc.lens.begin(), dc.lens.end()) + 5;
    const int batch = int(dc.lens.size());
    const int H = dc.h, Hkv = dc.hkv, D = dc.d, n_new = dc.n_new;
    AttentionParams p;
    p.num_heads = H;
    p.num_kv_heads = Hkv;
    p.head_dim = D;
    p.window = dc.window;
    std::vector<float> kc(size_t(batch) * cap * Hkv * D, NAN), vc(kc.size(), NAN);
    std::vector<float> qd(size_t(batch) * n_new * H * D);
    std::vector<float> want(qd.size());
    std::vector<int32_t> cache_len(batch);
    std::mt19937 rng(seed++);
    std::normal_distribution<float> nd(0.f, 1.5f);
    for (int b = 0; b < batch; ++b) {
      const int len = dc.lens[b];
      ASSERT_GE(len, n_new);
      cache_len[b] = len;
      std::vector<float> q(size_t(len) * H * D), k(size_t(len) * Hkv * D), v(k.size());
      for (float& x : q) x = nd(rng);
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      std::copy(k.begin(), k.end(), kc.begin() + size_t(b) * cap * Hkv * D);
      std::copy(v.begin(), v.end(), vc.begin() + size_t(b) * cap * Hkv * D);
      std::copy(q.end() - size_t(n_new) * H * D, q.end(), qd.begin() + size_t(b) * n_new * H * D);
      std::vector<float> out(q.size()), lse(size_t(len) * H);
      const int32_t cu[2] = {0, len};
      ref::attention_forward(p, q.data(), k.data(), v.data(), cu, 1, len, out.data(), lse.data());
      std::copy(out.end() - size_t(n_new) * H * D, out.end(), want.begin() + size_t(b) * n_new * H * D);
    }
    std::vector<float> got(qd.size(), NAN), got_ref(qd.size(), NAN);
    cpu::decode_attention(p, qd.data(), batch, n_new, kc.data(), vc.data(), cap, cache_len.data(), got.data());
    ref::decode_attention(p, qd.data(), batch, n_new, kc.data(), vc.data(), cap, cache_len.data(), got_ref.data());
    EXPECT_LE(RelErr(got, want, want.size()), kTol) << "cpu decode vs forward";
    EXPECT_LE(RelErr(got_ref, want, want.size()), kTol) << "ref decode vs forward";
  }
}

}  // namespace
}  // namespace tandem::kernels
