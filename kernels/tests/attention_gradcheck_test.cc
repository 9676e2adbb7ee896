// Reference attention in double (kernels/ref/attention_ref_math.h, T =
// double): the forward against an independent dense formulation (full score
// matrix, explicit mask), the backward against central finite differences of
// L = sum(out * G), and decode against the forward rows. Small shapes
// covering GQA, varlen, sliding window and non-causal attention.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/ref/attention_ref_math.h"

namespace tandem::kernels::ref {
namespace {

struct Case {
  std::vector<int> lengths;
  int h, hkv, d;
  bool causal;
  int window;
  float scale = 0.f;
  int sinks = 0;
};

AttentionParams Params(const Case& c) {
  AttentionParams p;
  p.num_heads = c.h;
  p.num_kv_heads = c.hkv;
  p.head_dim = c.d;
  p.causal = c.causal;
  p.window = c.window;
  p.scale = c.scale;
  p.sinks = c.sinks;
  return p;
}

std::vector<Case> Cases() {
  return {
      {{1}, 1, 1, 4, true, -1},
      {{3, 5}, 4, 2, 4, true, -1},
      {{6, 1, 4}, 4, 1, 3, true, 2},
      {{5, 3}, 2, 2, 4, false, -1},
      {{7}, 4, 2, 2, false, 3, 0.7f},
      {{9}, 8, 1, 2, true, -1},
      // Attention sinks: 2 sink keys beside a window of 2 (and of 1).
      {{9, 4}, 4, 2, 3, true, 2, 0.f, 2},
      {{7}, 2, 1, 4, true, 1, 0.f, 3},
  };
}

// Dense, independent formulation: explicit mask per (i, j) pair from the
// documented rule, full score matrix per (sequence, head).
void DenseForward(const AttentionParams& p, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<int32_t>& cu, std::vector<double>* out,
                  std::vector<double>* lse) {
  const int H = p.num_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const double scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(double(D));
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int s0 = cu[b], n = cu[b + 1] - cu[b];
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / Hkv);
      for (int i = 0; i < n; ++i) {
        std::vector<double> s(n, -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < n; ++j) {
          bool vis = p.causal ? j <= i : true;
          if (p.window > 0) {
            const bool sink = p.causal && j < p.sinks;
            vis = vis && (sink || ((i - j < p.window) && (j - i < p.window)));
          }
          if (!vis) continue;
          double dot = 0;
          for (int x = 0; x < D; ++x) {
            dot += q[(size_t(s0 + i) * H + h) * D + x] * k[(size_t(s0 + j) * Hkv + hk) * D + x];
          }
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int j = 0; j < n; ++j) l += std::exp(s[j] - m);
        for (int x = 0; x < D; ++x) {
          double o = 0;
          for (int j = 0; j < n; ++j) {
            o += std::exp(s[j] - m) / l * v[(size_t(s0 + j) * Hkv + hk) * D + x];
          }
          (*out)[(size_t(s0 + i) * H + h) * D + x] = o;
        }
        (*lse)[size_t(s0 + i) * H + h] = m + std::log(l);
      }
    }
  }
}

TEST(AttentionRefGradcheck, ForwardMatchesDenseAndBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const Case& c : Cases()) {
    const AttentionParams p = Params(c);
    std::vector<int32_t> cu = {0};
    for (int l : c.lengths) cu.push_back(cu.back() + l);
    const int t = cu.back(), ns = int(c.lengths.size());
    std::vector<double> q(size_t(t) * c.h * c.d), k(size_t(t) * c.hkv * c.d), v(k.size()), g(q.size());
    for (auto* x : {&q, &k, &v, &g})
      for (double& e : *x) e = nd(rng);
    std::vector<double> out(q.size()), lse(size_t(t) * c.h);
    AttentionForwardT<double>(p, q.data(), k.data(), v.data(), cu.data(), ns, out.data(), lse.data());
    std::vector<double> out_dense(q.size()), lse_dense(lse.size());
    DenseForward(p, q, k, v, cu, &out_dense, &lse_dense);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_dense[i], 1e-12);
    for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], lse_dense[i], 1e-12);

    std::vector<double> dq(q.size()), dk(k.size()), dv(k.size());
    AttentionBackwardT<double>(p, q.data(), k.data(), v.data(), out.data(), g.data(), lse.data(), cu.data(), ns, t,
                               dq.data(), dk.data(), dv.data());
    auto loss = [&]() {
      std::vector<double> o(q.size()), l(lse.size());
      AttentionForwardT<double>(p, q.data(), k.data(), v.data(), cu.data(), ns, o.data(), l.data());
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += o[i] * g[i];
      return s;
    };
    const double eps = 1e-5;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      double max_err = 0, max_ref = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double saved = x[i];
        x[i] = saved + eps;
        const double lp = loss();
        x[i] = saved - eps;
        const double lm = loss();
        x[i] = saved;
        const double fd = (lp - lm) / (2 * eps);
        max_err = std::max(max_err, std::fabs(fd - grad[i]));
        max_ref = std::max(max_ref, std::fabs(fd));
      }
      EXPECT_LE(max_err, 1e-7 * std::max(1.0, max_ref))
          << name << " lengths " << c.lengths.size() << " H" << c.h << " Hkv" << c.hkv << " window " << c.window
          << " sinks " << c.sinks << (c.causal ? " causal" : " full");
    };
    check(q, dq, "dq");
    check(k, dk, "dk");
    check(v, dv, "dv");
  }
}

TEST(AttentionRefGradcheck, DecodeMatchesForwardInDouble) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 1.0);
  AttentionParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 3;
  for (auto [window, sinks] : {std::pair{-1, 0}, std::pair{2, 0}, std::pair{2, 2}}) {
    p.window = window;
    p.sinks = sinks;
    const int len = 6, n_new = 2, cap = 8, H = 4, Hkv = 2, D = 3;
    std::vector<double> q(size_t(len) * H * D), k(size_t(cap) * Hkv * D), v(k.size());
    for (auto* x : {&q, &k, &v})
      for (double& e : *x) e = nd(rng);
    std::vector<double> out(q.size()), lse(size_t(len) * H);
    const int32_t cu[2] = {0, len};
    AttentionForwardT<double>(p, q.data(), k.data(), v.data(), cu, 1, out.data(), lse.data());
    std::vector<double> dec(size_t(n_new) * H * D);
    const int32_t cache_len = len;
    DecodeAttentionT<double>(p, q.data() + size_t(len - n_new) * H * D, 1, n_new, k.data(), v.data(), cap, &cache_len,
                             dec.data());
    for (size_t i = 0; i < dec.size(); ++i) {
      ASSERT_NEAR(dec[i], out[size_t(len - n_new) * H * D + i], 1e-12);
    }
  }
}

}  // namespace
}  // namespace tandem::kernels::ref
