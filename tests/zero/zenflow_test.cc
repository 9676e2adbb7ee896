// ZenFlow (worker/zero/zenflow.h) against a plain reference: the same
// documented algorithm written element by element, with no runs, no
// device/host copies and no thread (the host update is computed at once and
// applied one interval later, as the product applies it). With the
// reference Ops both use kernels::ref::adamw_step, so every step's
// parameters must be equal bit for bit; with the CPU Ops within 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backends.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "kernels/ref/ref_math.h"
#include "worker/zero/zenflow.h"

namespace tandem::zero {
namespace {

constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f, kDecay = 0.01f;

// The layout: flat parameters of `size` floats, the matrices in it, and the
// owned segments (global range -> optimizer/param/grad offsets).
struct Layout {
  size_t size = 0;
  std::vector<ZenFlowMatrix> matrices;
  std::vector<ZenFlowSegment> segments;
};

// The reference: state per global element; a row is a maximal run of owned
// elements with the same (segment, matrix, matrix row); elements outside any
// matrix are always important.
class Reference {
 public:
  Reference(const Layout& l, const ZenFlowOptions& o, const std::vector<float>& p0) : l_(l), o_(o) {
    p_ = p0;
    m_.assign(l.size, 0.f);
    v_ = m_;
    hp_ = m_;
    hm_ = m_;
    hv_ = m_;
    acc_ = m_;
    for (size_t si = 0; si < l.segments.size(); ++si) {
      const ZenFlowSegment& s = l.segments[si];
      for (size_t e = s.global; e < s.global + s.len; ++e) {
        long matrix = -1, row = -1;
        for (size_t mi = 0; mi < l.matrices.size(); ++mi) {
          const ZenFlowMatrix& m = l.matrices[mi];
          if (e >= m.offset && e < m.offset + m.rows * m.cols) {
            matrix = static_cast<long>(mi);
            row = static_cast<long>((e - m.offset) / m.cols);
          }
        }
        const bool same = !rows_.empty() && rows_.back().segment == static_cast<long>(si) &&
                          rows_.back().matrix == matrix && rows_.back().row == row && matrix >= 0 &&
                          rows_.back().last + 1 == e;
        if (same) {
          rows_.back().last = e;
        } else {
          rows_.push_back({static_cast<long>(si), matrix, row, e, e});
        }
      }
    }
    important_.assign(rows_.size(), true);
  }

  void Step(const std::vector<float>& g, float lr, int64_t t) {
    const int64_t s = o_.update_interval, w = o_.full_warm_up_steps;
    if (t <= w) {  // warm-up: plain AdamW everywhere
      for (size_t e = 0; e < l_.size; ++e) {
        if (Owned(e)) Adam(&p_[e], g[e], &m_[e], &v_[e], lr, t);
      }
      return;
    }
    const int64_t host_count = w + (t - w) / s;
    if (!selected_) {
      Select(g);
      for (size_t i = 0; i < rows_.size(); ++i) {
        if (!important_[i]) ForRow(i, [&](size_t e) { hp_[e] = p_[e], hm_[e] = m_[e], hv_[e] = v_[e]; });
      }
      selected_ = true;
      count_ = 0;
    }
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (important_[i]) {
        ForRow(i, [&](size_t e) { Adam(&p_[e], g[e], &m_[e], &v_[e], lr, t); });
      } else {
        ForRow(i, [&](size_t e) { acc_[e] += g[e]; });
      }
    }
    ++count_;
    if (t % s != 0) return;
    // The update handed over one interval ago lands now.
    for (size_t i : pending_) ForRow(i, [&](size_t e) { p_[e] = hp_[e]; });
    pending_.clear();
    std::vector<bool> was = important_;
    if (t % o_.select_interval == 0) Select(g);
    const float scale = 1.0f / static_cast<float>(count_);
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (!was[i] && important_[i]) {
        ForRow(i, [&](size_t e) {
          m_[e] = hm_[e], v_[e] = hv_[e];
          Adam(&p_[e], acc_[e] * scale, &m_[e], &v_[e], lr, host_count);
          acc_[e] = 0;
        });
      } else if (was[i] && !important_[i]) {
        ForRow(i, [&](size_t e) { hp_[e] = p_[e], hm_[e] = m_[e], hv_[e] = v_[e]; });
      } else if (!was[i] && !important_[i]) {
        ForRow(i, [&](size_t e) {
          Adam(&hp_[e], acc_[e] * scale, &hm_[e], &hv_[e], lr, host_count);
          acc_[e] = 0;
        });
        pending_.push_back(i);
      }
    }
    count_ = 0;
  }

  // The sync point: the pending update lands, host moments become the moments.
  void Sync() {
    for (size_t i : pending_) ForRow(i, [&](size_t e) { p_[e] = hp_[e]; });
    pending_.clear();
    for (size_t i = 0; i < rows_.size(); ++i) {
      if (!important_[i]) ForRow(i, [&](size_t e) { m_[e] = hm_[e], v_[e] = hv_[e]; });
    }
  }

  const std::vector<float>& p() const { return p_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  size_t unimportant_rows() const {
    size_t n = 0;
    for (bool b : important_) n += b ? 0 : 1;
    return n;
  }

 private:
  struct Row {
    long segment, matrix, row;
    size_t first, last;  // global elements, inclusive
  };

  bool Owned(size_t e) const {
    for (const ZenFlowSegment& s : l_.segments) {
      if (e >= s.global && e < s.global + s.len) return true;
    }
    return false;
  }

  template <typename F>
  void ForRow(size_t i, F f) {
    for (size_t e = rows_[i].first; e <= rows_[i].last; ++e) f(e);
  }

  static void Adam(float* p, float g, float* m, float* v, float lr, int64_t step) {
    kernels::ref::adamw_step<float>(p, &g, m, v, 1, lr, kBeta1, kBeta2, kEps, kDecay, step);
  }

  // Per (segment, matrix): the ceil(K x rows) rows of largest gradient norm.
  void Select(const std::vector<float>& g) {
    for (size_t a = 0; a < rows_.size();) {
      if (rows_[a].matrix < 0) {
        important_[a++] = true;
        continue;
      }
      size_t b = a;
      while (b < rows_.size() && rows_[b].segment == rows_[a].segment && rows_[b].matrix == rows_[a].matrix) ++b;
      std::vector<std::pair<double, size_t>> norms;
      for (size_t i = a; i < b; ++i) {
        double sum = 0;
        ForRow(i, [&](size_t e) { sum += static_cast<double>(g[e]) * g[e]; });
        norms.push_back({-sum, i});  // sorted ascending: largest first, then the lower row
      }
      std::sort(norms.begin(), norms.end());
      const size_t k =
          std::clamp<size_t>(static_cast<size_t>(std::ceil(o_.topk_fraction * static_cast<double>(b - a))), 1, b - a);
      for (size_t i = a; i < b; ++i) important_[i] = false;
      for (size_t j = 0; j < k; ++j) important_[norms[j].second] = true;
      a = b;
    }
  }

  Layout l_;
  ZenFlowOptions o_;
  std::vector<Row> rows_;
  std::vector<bool> important_;
  std::vector<float> p_, m_, v_, hp_, hm_, hv_, acc_;
  std::vector<size_t> pending_;
  int64_t count_ = 0;
  bool selected_ = false;
};

// One rank's ZenFlow on host memory: the device arrays in optimizer / param
// / grad coordinates, filled from and read back into global coordinates.
class Product {
 public:
  Product(const Layout& l, const ZenFlowOptions& o, const std::vector<float>& p0, kernels::Ops* ops)
      : l_(l), mem_(kernels::MakeHostMemory()) {
    size_t opt = 0, param = 0, grad = 0;
    for (const ZenFlowSegment& s : l.segments) {
      opt = std::max(opt, s.opt + s.len);
      param = std::max(param, s.param + s.len);
      grad = std::max(grad, s.grad + s.len);
    }
    p_.assign(param, 0.f);
    g_.assign(grad, 0.f);
    m_.assign(opt, 0.f);
    v_.assign(opt, 0.f);
    for (const ZenFlowSegment& s : l.segments) {
      for (size_t j = 0; j < s.len; ++j) p_[s.param + j] = p0[s.global + j];
    }
    ZenFlowAdamW a;
    a.beta1 = kBeta1;
    a.beta2 = kBeta2;
    a.eps = kEps;
    a.weight_decay = kDecay;
    auto z = ZenFlow::Create(o, a, l.segments, opt);
    EXPECT_TRUE(z.ok()) << z.status();
    z_ = std::move(*z);
    d_.ops = ops;
    d_.mem = mem_.get();
    d_.p = p_.data();
    d_.g = g_.data();
    d_.m = m_.data();
    d_.v = v_.data();
  }

  void Step(const std::vector<float>& g, float lr, int64_t t) {
    for (const ZenFlowSegment& s : l_.segments) {
      for (size_t j = 0; j < s.len; ++j) g_[s.grad + j] = g[s.global + j];
    }
    ASSERT_TRUE(z_->Step(d_, lr, t).ok());
  }
  void Sync() { z_->Sync(d_); }
  std::vector<float> Global(const std::vector<float>& a, bool opt) const {
    std::vector<float> out(l_.size, 0.f);
    for (const ZenFlowSegment& s : l_.segments) {
      for (size_t j = 0; j < s.len; ++j) out[s.global + j] = a[(opt ? s.opt : s.param) + j];
    }
    return out;
  }
  std::vector<float> p() const { return Global(p_, false); }
  std::vector<float> m() const { return Global(m_, true); }
  std::vector<float> v() const { return Global(v_, true); }
  const ZenFlowStats& stats() const { return z_->stats(); }

 private:
  Layout l_;
  std::unique_ptr<kernels::DeviceMemory> mem_;
  std::vector<float> p_, g_, m_, v_;
  std::unique_ptr<ZenFlow> z_;
  ZenFlowDevice d_;
};

double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    worst = std::max(worst, d / std::max(1e-3, std::fabs(static_cast<double>(b[i]))));
  }
  return worst;
}

// Two matrices and non-matrix elements around them; `split` cuts the owned
// range into two segments in the middle of a row of the first matrix (as a
// ZeRO shard boundary does), with different optimizer/param/grad offsets.
Layout MakeLayout(bool split) {
  Layout l;
  l.size = 3 + 12 * 5 + 4 + 7 * 3 + 2;
  l.matrices = {{3, 12, 5}, {3 + 60 + 4, 7, 3}};
  if (!split) {
    l.segments = {{0, 0, 0, 0, l.size}};
  } else {
    const size_t cut = 3 + 4 * 5 + 2;  // row 4 of the first matrix, element 2
    l.segments = {{cut, 0, 100, 7, l.size - cut}, {0, l.size - cut, 200, 300, cut}};
  }
  return l;
}

// Gradients whose large rows drift, so re-selection moves rows both ways.
std::vector<float> Gradient(const Layout& l, int64_t t, std::mt19937& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> g(l.size);
  for (size_t e = 0; e < l.size; ++e) g[e] = 0.1f * n(rng);
  const ZenFlowMatrix& m = l.matrices[0];
  for (size_t r = 0; r < m.rows; ++r) {
    const float boost = (r + static_cast<size_t>(t) / 8) % 4 == 0 ? 3.f : 1.f;
    for (size_t c = 0; c < m.cols; ++c) g[m.offset + r * m.cols + c] *= boost;
  }
  return g;
}

void RunAgainstReference(bool split, int update_interval, int select_interval, kernels::Ops* ops, double tol,
                         int warm_up = 0) {
  const Layout l = MakeLayout(split);
  ZenFlowOptions o;
  o.topk_fraction = 0.25;
  o.update_interval = update_interval;
  o.select_interval = select_interval;
  o.full_warm_up_steps = warm_up;
  o.matrices = l.matrices;
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 0.5f);
  std::vector<float> p0(l.size);
  for (float& x : p0) x = n(rng);
  Reference ref(l, o, p0);
  Product prod(l, o, p0, ops);
  const int kSteps = warm_up + 6 * select_interval + 3;  // ends between hand-overs
  for (int64_t t = 1; t <= kSteps; ++t) {
    const float lr = 1e-2f * (1.0f - 0.5f * static_cast<float>(t) / kSteps);
    const std::vector<float> g = Gradient(l, t, rng);
    ref.Step(g, lr, t);
    prod.Step(g, lr, t);
    if (tol == 0) {
      ASSERT_EQ(prod.p(), ref.p()) << "step " << t;
    } else {
      ASSERT_LE(MaxRelDiff(prod.p(), ref.p()), tol) << "step " << t;
    }
  }
  EXPECT_GT(ref.unimportant_rows(), 10u);
  EXPECT_EQ(prod.stats().host_updates, (kSteps - warm_up) / update_interval - 1);
  ref.Sync();
  prod.Sync();
  if (tol == 0) {
    EXPECT_EQ(prod.p(), ref.p());
    EXPECT_EQ(prod.m(), ref.m());
    EXPECT_EQ(prod.v(), ref.v());
  } else {
    EXPECT_LE(MaxRelDiff(prod.p(), ref.p()), tol);
    EXPECT_LE(MaxRelDiff(prod.m(), ref.m()), tol);
    EXPECT_LE(MaxRelDiff(prod.v(), ref.v()), tol);
  }
}

TEST(ZenFlowReference, EqualsThePlainAlgorithmBitForBit) {
  auto ops = kernels::MakeReferenceOps();
  for (bool split : {false, true}) {
    for (auto [s, n] : {std::pair{4, 8}, std::pair{1, 2}, std::pair{2, 2}, std::pair{3, 12}}) {
      SCOPED_TRACE(testing::Message() << "split " << split << " S " << s << " N " << n);
      RunAgainstReference(split, s, n, ops.get(), 0);
    }
  }
}

TEST(ZenFlowReference, WarmUpIsPlainAdamWThenTheAlgorithm) {
  // The warm-up steps update every row on the device; the first selection
  // follows them, and the host count continues from the warm-up's count.
  auto ops = kernels::MakeReferenceOps();
  for (bool split : {false, true}) {
    for (auto [s, n, w] : {std::tuple{4, 8, 4}, std::tuple{4, 8, 12}, std::tuple{1, 2, 3}, std::tuple{3, 12, 6}}) {
      SCOPED_TRACE(testing::Message() << "split " << split << " S " << s << " N " << n << " W " << w);
      RunAgainstReference(split, s, n, ops.get(), 0, w);
    }
  }
}

TEST(ZenFlowReference, WarmUpMustBeAMultipleOfTheUpdateInterval) {
  ZenFlowOptions o;
  o.topk_fraction = 0.1;
  o.update_interval = 4;
  o.select_interval = 8;
  o.full_warm_up_steps = 6;
  const Layout l = MakeLayout(false);
  auto z = ZenFlow::Create(o, ZenFlowAdamW{}, l.segments, l.size);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("full_warm_up_steps (6)"), std::string::npos) << z.status();
  o.full_warm_up_steps = -4;
  EXPECT_FALSE(ZenFlow::Create(o, ZenFlowAdamW{}, l.segments, l.size).ok());
}

TEST(ZenFlowReference, CpuOpsMatchWithinRounding) {
  auto ops = kernels::MakeCpuOps(2);
  RunAgainstReference(/*split=*/true, 4, 8, ops.get(), 1e-5);
}

TEST(ZenFlowReference, UnimportantRowsLagOneInterval) {
  // One row that is never selected (zero gradient except in its own
  // window): its parameters change only at hand-overs, one interval after
  // the gradient arrived.
  Layout l;
  l.size = 4 * 2;
  l.matrices = {{0, 4, 2}};
  l.segments = {{0, 0, 0, 0, l.size}};
  ZenFlowOptions o;
  o.topk_fraction = 0.25;  // one row of four
  o.update_interval = 4;
  o.select_interval = 1000;
  o.matrices = l.matrices;
  auto ops = kernels::MakeReferenceOps();
  const std::vector<float> p0(l.size, 1.f);
  Product prod(l, o, p0, ops.get());
  std::vector<float> g(l.size, 0.f);
  g[0] = g[1] = 1.f;  // row 0: the important row
  g[6] = 0.5f;        // row 3: unimportant
  std::vector<float> last = p0;
  for (int64_t t = 1; t <= 12; ++t) {
    prod.Step(g, 0.1f, t);
    const std::vector<float> p = prod.p();
    EXPECT_NE(p[0], last[0]) << "the important row moves every step " << t;
    if (t == 8 || t == 12) {
      EXPECT_LT(p[6], last[6]) << "step " << t << ": the previous interval's update lands";
    } else {
      EXPECT_EQ(p[6], last[6]) << "step " << t;
    }
    last = p;
  }
}

}  // namespace
}  // namespace tandem::zero
