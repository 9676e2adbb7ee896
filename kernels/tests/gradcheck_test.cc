// Gradient checks of the reference backward passes (ref_math.h instantiated
// in double) against central finite differences in double:
//   L(inputs) = sum(R * forward(inputs)) for a fixed random R,
//   dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h, h = 1e-5,
// per-tensor relative error <= 1e-6. Backward functions receive dy = R.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "kernels/ref/ref_math.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomIds;
using testing::RandomVec;
using testing::RelErr;
using Vec = std::vector<double>;

constexpr double kH = 1e-5;
constexpr double kTol = 1e-6;

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of loss() with respect to every element of x.
Vec NumericGrad(Vec& x, const std::function<double()>& loss) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + kH;
    const double lp = loss();
    x[i] = x0 - kH;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * kH);
  }
  return g;
}

TEST(GradCheck, Matmul) {
  // C = op(A) op(B); dA and dB through the same matmul with flags, as the
  // model's backward uses them.
  const int m = 5, n = 4, k = 6;
  uint64_t seed = 1;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? m : k, ldb = tb ? k : n;
      Vec a = RandomVec<double>(static_cast<size_t>(m) * k, seed++);
      Vec b = RandomVec<double>(static_cast<size_t>(k) * n, seed++);
      Vec r = RandomVec<double>(static_cast<size_t>(m) * n, seed++);
      const double alpha = 0.7;
      Vec c(m * n);
      auto loss = [&] {
        ref::matmul<double>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, 0.0, c.data(), n);
        return Dot(c, r);
      };
      Vec da(a.size()), db(b.size());
      // dA: [m,k] = alpha dC op(B)^T, or stored [k,m] = alpha op(B) dC^T.
      if (!ta) {
        ref::matmul<double>(false, !tb, m, k, n, alpha, r.data(), n, b.data(), ldb, 0.0, da.data(), k);
      } else {
        ref::matmul<double>(tb, true, k, m, n, alpha, b.data(), ldb, r.data(), n, 0.0, da.data(), m);
      }
      // dB: [k,n] = alpha op(A)^T dC, or stored [n,k] = alpha dC^T op(A).
      if (!tb) {
        ref::matmul<double>(!ta, false, k, n, m, alpha, a.data(), lda, r.data(), n, 0.0, db.data(), n);
      } else {
        ref::matmul<double>(true, ta, n, k, m, alpha, r.data(), n, a.data(), lda, 0.0, db.data(), k);
      }
      EXPECT_LE(RelErr(da, NumericGrad(a, loss)), kTol) << ta << tb;
      EXPECT_LE(RelErr(db, NumericGrad(b, loss)), kTol) << ta << tb;
    }
  }
}

TEST(GradCheck, Embedding) {
  const int v = 6, t = 9, c = 5;
  Vec table = RandomVec<double>(v * c, 11);
  auto ids = RandomIds(t, 0, v - 1, 12);
  Vec r = RandomVec<double>(t * c, 13);
  Vec out(t * c);
  auto loss = [&] {
    ref::embedding_forward<double>(ids.data(), t, table.data(), c, out.data());
    return Dot(out, r);
  };
  Vec dtable(table.size(), 0.0);
  ref::embedding_backward<double>(ids.data(), t, r.data(), c, dtable.data());
  EXPECT_LE(RelErr(dtable, NumericGrad(table, loss)), kTol);
}

TEST(GradCheck, RmsNorm) {
  for (int c : {2, 7, 16}) {
    const int t = 3;
    Vec x = RandomVec<double>(t * c, 20 + c, -2, 2);
    Vec w = RandomVec<double>(c, 21 + c, 0.5, 1.5);
    Vec r = RandomVec<double>(t * c, 22 + c);
    Vec y(t * c), rstd(t);
    const double eps = 1e-5;
    auto loss = [&] {
      ref::rmsnorm_forward<double>(x.data(), w.data(), t, c, eps, y.data(), rstd.data());
      return Dot(y, r);
    };
    loss();
    Vec dx(x.size()), dw(c, 0.0);
    ref::rmsnorm_backward<double>(r.data(), x.data(), w.data(), rstd.data(), t, c, dx.data(), dw.data());
    EXPECT_LE(RelErr(dx, NumericGrad(x, loss)), kTol) << c;
    EXPECT_LE(RelErr(dw, NumericGrad(w, loss)), kTol) << c;
  }
}

TEST(GradCheck, SwiGlu) {
  const size_t n = 40;
  Vec g = RandomVec<double>(n, 30, -6, 6), u = RandomVec<double>(n, 31, -2, 2);
  Vec r = RandomVec<double>(n, 32);
  Vec h(n);
  auto loss = [&] {
    ref::swiglu_forward<double>(g.data(), u.data(), n, h.data());
    return Dot(h, r);
  };
  Vec dg(n), du(n);
  ref::swiglu_backward<double>(r.data(), g.data(), u.data(), n, dg.data(), du.data());
  EXPECT_LE(RelErr(dg, NumericGrad(g, loss)), kTol);
  EXPECT_LE(RelErr(du, NumericGrad(u, loss)), kTol);
}

TEST(GradCheck, BiasAndAdd) {
  const int rows = 4, cols = 7;
  Vec bias = RandomVec<double>(cols, 40), y0 = RandomVec<double>(rows * cols, 41);
  Vec x = RandomVec<double>(rows * cols, 43);
  Vec r = RandomVec<double>(rows * cols, 42);
  auto loss = [&] {
    Vec y = y0;
    ref::add_bias<double>(y.data(), bias.data(), rows, cols);
    ref::add_inplace<double>(y.data(), x.data(), y.size());
    return Dot(y, r);
  };
  Vec dbias(cols, 0.0);
  ref::bias_backward<double>(r.data(), rows, cols, dbias.data());
  EXPECT_LE(RelErr(dbias, NumericGrad(bias, loss)), kTol);
  EXPECT_LE(RelErr(r, NumericGrad(x, loss)), kTol);  // d(y + x)/dx = identity
}

TEST(GradCheck, RopeInverseIsTheGradient) {
  for (RopeType type : {RopeType::kDefault, RopeType::kYarn}) {
    const int t = 4, nh = 3, d = 8, max_pos = 50;
    RopeConfig cfg;
    cfg.head_dim = d;
    cfg.type = type;
    cfg.factor = 4;  // yarn: attention scaling != 1, so not orthogonal
    cfg.original_max_position = 16;
    std::vector<float> cf(max_pos * d / 2), sf(cf.size());
    rope_tables(cfg, max_pos, max_pos, cf.data(), sf.data());
    Vec cos(cf.begin(), cf.end()), sin(sf.begin(), sf.end());
    auto pos = RandomIds(t, 0, max_pos - 1, 50);
    Vec x = RandomVec<double>(t * nh * d, 51), r = RandomVec<double>(x.size(), 52);
    auto loss = [&] {
      Vec y = x;
      ref::rope_apply<double>(y.data(), pos.data(), t, nh, d, cos.data(), sin.data(), false);
      return Dot(y, r);
    };
    Vec dx = r;
    ref::rope_apply<double>(dx.data(), pos.data(), t, nh, d, cos.data(), sin.data(), true);
    EXPECT_LE(RelErr(dx, NumericGrad(x, loss)), kTol);
  }
}

TEST(GradCheck, LmHeadLogprobs) {
  const int t = 5, c = 4, v = 7;
  Vec h = RandomVec<double>(t * c, 60, -1, 1), w = RandomVec<double>(v * c, 61, -1, 1);
  auto tg = RandomIds(t, 0, v - 1, 62);
  tg[2] = -1;  // ignored
  Vec dlogp = RandomVec<double>(t, 63);
  Vec logp(t), ent(t);
  auto loss = [&] {
    ref::lm_head_logprobs_forward<double>(h.data(), w.data(), tg.data(), t, c, v, logp.data(), ent.data());
    return Dot(logp, dlogp);
  };
  Vec dh(h.size()), dw(w.size(), 0.0);
  ref::lm_head_logprobs_backward<double>(h.data(), w.data(), tg.data(), dlogp.data(), t, c, v, dh.data(), dw.data());
  EXPECT_LE(RelErr(dh, NumericGrad(h, loss)), kTol);
  EXPECT_LE(RelErr(dw, NumericGrad(w, loss)), kTol);
  // The entropy output itself: -sum p log p of an explicit softmax.
  loss();
  for (int i = 0; i < t; ++i) {
    Vec l(v);
    double mx = -1e300, s = 0, e = 0;
    for (int j = 0; j < v; ++j) {
      for (int k = 0; k < c; ++k) l[j] += h[i * c + k] * w[j * c + k];
      mx = std::max(mx, l[j]);
    }
    for (int j = 0; j < v; ++j) s += std::exp(l[j] - mx);
    for (int j = 0; j < v; ++j) {
      const double p = std::exp(l[j] - mx) / s;
      e -= p * std::log(p);
    }
    EXPECT_NEAR(ent[i], e, 1e-12);
  }
}

}  // namespace
}  // namespace tandem::kernels
