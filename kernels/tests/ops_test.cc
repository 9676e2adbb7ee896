// Table-driven comparison of every non-attention op of the fast CPU backend
// with the reference backend, forward and backward, over odd shapes.
// Bound: per-tensor relative error max|cpu - ref| / max|ref| <= 1e-5 (fp32)
// for every op, sgemm included (K up to 4099). Runs with 2 and 1 threads and
// prints the largest error seen per output at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "kernels/ops.h"
#include "kernels/tests/test_util.h"

namespace tandem::kernels {
namespace {

using testing::RandomIds;
using testing::RandomVec;
using testing::RelErr;

constexpr double kTol = 1e-5;

// Largest relative error seen per op output, printed after all tests (the
// figures quoted in docs/kernels.md).
std::map<std::string, double>& MaxErr() {
  static std::map<std::string, double> m;
  return m;
}
double Track(const std::string& label, double err) {
  double& m = MaxErr()[label];
  m = std::max(m, err);
  return err;
}
class PrintMaxErr : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("max relative error cpu vs reference:\n");
    for (const auto& [label, err] : MaxErr())
      std::printf("  %-28s %.2e\n", label.c_str(), err);
  }
};
const auto* const kPrintMaxErr =
    ::testing::AddGlobalTestEnvironment(new PrintMaxErr);

class OpsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ref_ = MakeReferenceOps();
    cpu_ = MakeCpuOps(GetParam());
  }
  std::unique_ptr<Ops> ref_, cpu_;
};

TEST_P(OpsTest, Matmul) {
  struct Shape { int m, n, k; };
  const Shape shapes[] = {{1, 1, 1},    {7, 13, 5},    {33, 17, 129},
                          {64, 64, 64}, {1, 300, 513}, {128, 96, 1024},
                          {17, 1, 2048}, {5, 33, 4099}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int ab = 0; ab < 2; ++ab) {
          const float alpha = ab ? 0.5f : 1.f, beta = ab ? 1.5f : 0.f;
          const int lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 1,
                    ldc = s.n + 2;
          auto a = RandomVec(static_cast<size_t>(ta ? s.k : s.m) * lda, seed++);
          auto b = RandomVec(static_cast<size_t>(tb ? s.n : s.k) * ldb, seed++);
          auto c_ref = RandomVec(static_cast<size_t>(s.m) * ldc, seed++);
          if (beta == 0.f) {  // beta 0 must ignore C, even NaN
            for (auto& x : c_ref) x = NAN;
          }
          auto c_cpu = c_ref;
          ref_->matmul(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(),
                       ldb, beta, c_ref.data(), ldc);
          cpu_->matmul(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(),
                       ldb, beta, c_cpu.data(), ldc);
          // Compare only the stored n columns of each row (padding is NaN).
          std::vector<float> r, c;
          for (int i = 0; i < s.m; ++i)
            for (int j = 0; j < s.n; ++j) {
              r.push_back(c_ref[static_cast<size_t>(i) * ldc + j]);
              c.push_back(c_cpu[static_cast<size_t>(i) * ldc + j]);
            }
          EXPECT_LE(Track("Matmul.c", RelErr(c, r)), kTol)
              << "m=" << s.m << " n=" << s.n << " k=" << s.k << " ta=" << ta
              << " tb=" << tb << " beta=" << beta;
        }
      }
    }
  }
}

TEST_P(OpsTest, Embedding) {
  struct Shape { int v, t, c; };
  const Shape shapes[] = {{1, 1, 1}, {50, 5, 17}, {50, 300, 256},
                          {7, 1000, 100}, {4096, 513, 64}};
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    auto table = RandomVec(static_cast<size_t>(s.v) * s.c, seed++);
    auto ids = RandomIds(s.t, 0, s.v - 1, seed++);  // repeats included
    std::vector<float> o_ref(static_cast<size_t>(s.t) * s.c), o_cpu(o_ref.size());
    ref_->embedding_forward(ids.data(), s.t, table.data(), s.c, o_ref.data());
    cpu_->embedding_forward(ids.data(), s.t, table.data(), s.c, o_cpu.data());
    EXPECT_EQ(RelErr(o_cpu, o_ref), 0.0) << s.v << " " << s.t << " " << s.c;
    auto dout = RandomVec(o_ref.size(), seed++);
    auto dt_ref = RandomVec(table.size(), seed++);
    auto dt_cpu = dt_ref;
    ref_->embedding_backward(ids.data(), s.t, dout.data(), s.c, dt_ref.data());
    cpu_->embedding_backward(ids.data(), s.t, dout.data(), s.c, dt_cpu.data());
    EXPECT_LE(Track("Embedding.dt", RelErr(dt_cpu, dt_ref)), kTol) << s.v << " " << s.t << " " << s.c;
  }
}

TEST_P(OpsTest, RmsNorm) {
  struct Shape { int t, c; };
  // No C = 1: there y = sign(x) w and dx is pure cancellation noise
  // (1 - x^2 / (x^2 + eps)), ill-conditioned in any precision.
  const Shape shapes[] = {{1, 2},    {1, 7},     {3, 64},   {17, 100},
                          {64, 256}, {33, 1000}, {5, 4097}, {2048, 33}};
  uint64_t seed = 200;
  for (const Shape& s : shapes) {
    const size_t n = static_cast<size_t>(s.t) * s.c;
    auto x = RandomVec(n, seed++, -3, 3);
    auto w = RandomVec(s.c, seed++, 0.5, 1.5);
    std::vector<float> y_ref(n), y_cpu(n), r_ref(s.t), r_cpu(s.t);
    ref_->rmsnorm_forward(x.data(), w.data(), s.t, s.c, 1e-5f, y_ref.data(), r_ref.data());
    cpu_->rmsnorm_forward(x.data(), w.data(), s.t, s.c, 1e-5f, y_cpu.data(), r_cpu.data());
    EXPECT_LE(Track("RmsNorm.y", RelErr(y_cpu, y_ref)), kTol) << s.t << "x" << s.c;
    EXPECT_LE(Track("RmsNorm.r", RelErr(r_cpu, r_ref)), kTol) << s.t << "x" << s.c;
    auto dy = RandomVec(n, seed++);
    std::vector<float> dx_ref(n, NAN), dx_cpu(n, NAN);
    auto dw_ref = RandomVec(s.c, seed++);
    auto dw_cpu = dw_ref;
    ref_->rmsnorm_backward(dy.data(), x.data(), w.data(), r_ref.data(), s.t, s.c,
                           dx_ref.data(), dw_ref.data());
    cpu_->rmsnorm_backward(dy.data(), x.data(), w.data(), r_ref.data(), s.t, s.c,
                           dx_cpu.data(), dw_cpu.data());
    EXPECT_LE(Track("RmsNorm.dx", RelErr(dx_cpu, dx_ref)), kTol) << s.t << "x" << s.c;
    EXPECT_LE(Track("RmsNorm.dw", RelErr(dw_cpu, dw_ref)), kTol) << s.t << "x" << s.c;
  }
}

TEST_P(OpsTest, SwiGlu) {
  const size_t sizes[] = {1, 7, 8, 9, 100, 3 * 4096 + 5, 100000};
  uint64_t seed = 300;
  for (size_t n : sizes) {
    auto gate = RandomVec(n, seed++, -12, 12);
    if (n > 9) {  // saturated sigmoid on both sides
      gate[0] = -100.f;
      gate[1] = 100.f;
      gate[2] = -87.5f;
      gate[3] = 0.f;
    }
    auto up = RandomVec(n, seed++, -2, 2);
    std::vector<float> h_ref(n), h_cpu(n);
    ref_->swiglu_forward(gate.data(), up.data(), n, h_ref.data());
    cpu_->swiglu_forward(gate.data(), up.data(), n, h_cpu.data());
    EXPECT_LE(Track("SwiGlu.h", RelErr(h_cpu, h_ref)), kTol) << n;
    auto dh = RandomVec(n, seed++);
    std::vector<float> dg_ref(n), dg_cpu(n), du_ref(n), du_cpu(n);
    ref_->swiglu_backward(dh.data(), gate.data(), up.data(), n, dg_ref.data(), du_ref.data());
    cpu_->swiglu_backward(dh.data(), gate.data(), up.data(), n, dg_cpu.data(), du_cpu.data());
    EXPECT_LE(Track("SwiGlu.dg", RelErr(dg_cpu, dg_ref)), kTol) << n;
    EXPECT_LE(Track("SwiGlu.du", RelErr(du_cpu, du_ref)), kTol) << n;
  }
}

TEST_P(OpsTest, AddScaleBias) {
  uint64_t seed = 400;
  for (size_t n : {size_t{1}, size_t{31}, size_t{100003}}) {
    auto x = RandomVec(n, seed++);
    auto y_ref = RandomVec(n, seed++);
    auto y_cpu = y_ref;
    ref_->add_inplace(y_ref.data(), x.data(), n);
    cpu_->add_inplace(y_cpu.data(), x.data(), n);
    EXPECT_LE(Track("AddScaleBias.y", RelErr(y_cpu, y_ref)), kTol) << n;
    ref_->scale(y_ref.data(), -0.37f, n);
    cpu_->scale(y_cpu.data(), -0.37f, n);
    EXPECT_LE(Track("AddScaleBias.y", RelErr(y_cpu, y_ref)), kTol) << n;
  }
  struct Shape { int rows, cols; };
  for (Shape s : {Shape{1, 1}, Shape{7, 13}, Shape{300, 129}, Shape{1000, 64},
                  Shape{2, 5000}}) {
    const size_t n = static_cast<size_t>(s.rows) * s.cols;
    auto bias = RandomVec(s.cols, seed++);
    auto y_ref = RandomVec(n, seed++);
    auto y_cpu = y_ref;
    ref_->add_bias(y_ref.data(), bias.data(), s.rows, s.cols);
    cpu_->add_bias(y_cpu.data(), bias.data(), s.rows, s.cols);
    EXPECT_LE(Track("AddScaleBias.y", RelErr(y_cpu, y_ref)), kTol) << s.rows << "x" << s.cols;
    auto db_ref = RandomVec(s.cols, seed++);
    auto db_cpu = db_ref;
    ref_->bias_backward(y_ref.data(), s.rows, s.cols, db_ref.data());
    cpu_->bias_backward(y_ref.data(), s.rows, s.cols, db_cpu.data());
    EXPECT_LE(Track("AddScaleBias.db", RelErr(db_cpu, db_ref)), kTol) << s.rows << "x" << s.cols;
  }
}

TEST_P(OpsTest, Rope) {
  struct Shape { int t, nh, d; RopeType type; };
  const Shape shapes[] = {{1, 1, 2, RopeType::kDefault},
                          {5, 3, 8, RopeType::kLinear},
                          {17, 4, 64, RopeType::kDynamicNtk},
                          {64, 8, 128, RopeType::kYarn},
                          {33, 2, 96, RopeType::kDefault}};
  uint64_t seed = 500;
  for (const Shape& s : shapes) {
    RopeConfig cfg;
    cfg.head_dim = s.d;
    cfg.type = s.type;
    cfg.factor = 4.0;
    cfg.original_max_position = 64;
    const int max_pos = 300;
    std::vector<float> cos(static_cast<size_t>(max_pos) * s.d / 2), sin(cos.size());
    rope_tables(cfg, max_pos, max_pos, cos.data(), sin.data());
    auto pos = RandomIds(s.t, 0, max_pos - 1, seed++);
    const size_t n = static_cast<size_t>(s.t) * s.nh * s.d;
    auto x = RandomVec(n, seed++);
    for (bool inverse : {false, true}) {
      auto x_ref = x, x_cpu = x;
      ref_->rope_apply(x_ref.data(), pos.data(), s.t, s.nh, s.d, cos.data(), sin.data(), inverse);
      cpu_->rope_apply(x_cpu.data(), pos.data(), s.t, s.nh, s.d, cos.data(), sin.data(), inverse);
      EXPECT_LE(Track("Rope.x", RelErr(x_cpu, x_ref)), kTol) << s.t << " " << s.nh << " " << s.d;
    }
  }
}

TEST_P(OpsTest, LmHeadLogprobs) {
  struct Shape { int t, c, v, chunk; };
  const Shape shapes[] = {{1, 1, 1, 1},      {1, 3, 2, 4},      {3, 16, 5, 2},
                          {17, 37, 100, 7},  {40, 64, 1000, 64}, {9, 33, 5000, 4},
                          {64, 24, 4099, 16}, {2, 8, 17, 1}};
  uint64_t seed = 600;
  for (const Shape& s : shapes) {
    auto h = RandomVec(static_cast<size_t>(s.t) * s.c, seed++, -1, 1);
    auto w = RandomVec(static_cast<size_t>(s.v) * s.c, seed++, -0.6, 0.6);
    auto tg = RandomIds(s.t, 0, s.v - 1, seed++);
    if (s.t > 2) tg[1] = -100;  // ignored token
    std::vector<float> scratch(static_cast<size_t>(s.chunk) * s.v);
    std::vector<float> lp_ref(s.t), lp_cpu(s.t), en_ref(s.t), en_cpu(s.t);
    ref_->lm_head_logprobs_forward(h.data(), w.data(), tg.data(), s.t, s.c, s.v, s.chunk,
                                   scratch.data(), lp_ref.data(), en_ref.data());
    cpu_->lm_head_logprobs_forward(h.data(), w.data(), tg.data(), s.t, s.c, s.v, s.chunk,
                                   scratch.data(), lp_cpu.data(), en_cpu.data());
    const std::string where = "t=" + std::to_string(s.t) + " c=" + std::to_string(s.c) +
                              " v=" + std::to_string(s.v);
    EXPECT_LE(Track("LmHeadLogprobs.lp", RelErr(lp_cpu, lp_ref)), kTol) << where;
    if (s.v > 1) EXPECT_LE(Track("LmHeadLogprobs.en", RelErr(en_cpu, en_ref)), kTol) << where;
    std::vector<float> lp_only(s.t);  // entropy == nullptr path
    cpu_->lm_head_logprobs_forward(h.data(), w.data(), tg.data(), s.t, s.c, s.v, s.chunk,
                                   scratch.data(), lp_only.data(), nullptr);
    EXPECT_EQ(RelErr(lp_only, lp_cpu), 0.0) << where;

    auto dlogp = RandomVec(s.t, seed++, -1, 1);
    if (s.t > 3) dlogp[3] = 0.f;  // untrained token
    std::vector<float> dh_ref(h.size(), NAN), dh_cpu(h.size(), NAN);
    auto dw_ref = RandomVec(w.size(), seed++, -0.1, 0.1);
    auto dw_cpu = dw_ref;
    ref_->lm_head_logprobs_backward(h.data(), w.data(), tg.data(), dlogp.data(), s.t, s.c,
                                    s.v, s.chunk, scratch.data(), dh_ref.data(), dw_ref.data());
    cpu_->lm_head_logprobs_backward(h.data(), w.data(), tg.data(), dlogp.data(), s.t, s.c,
                                    s.v, s.chunk, scratch.data(), dh_cpu.data(), dw_cpu.data());
    EXPECT_LE(Track("LmHeadLogprobs.dh", RelErr(dh_cpu, dh_ref)), kTol) << where;
    EXPECT_LE(Track("LmHeadLogprobs.dw", RelErr(dw_cpu, dw_ref)), kTol) << where;
  }
}

TEST_P(OpsTest, LmHeadAllTokensUntrained) {
  const int t = 10, c = 8, v = 50, chunk = 4;
  auto h = RandomVec(t * c, 1), w = RandomVec(v * c, 2);
  auto tg = RandomIds(t, 0, v - 1, 3);
  std::vector<float> dlogp(t, 0.f), scratch(chunk * v), dh(t * c, NAN);
  auto dw = RandomVec(v * c, 4);
  const auto dw0 = dw;
  cpu_->lm_head_logprobs_backward(h.data(), w.data(), tg.data(), dlogp.data(), t, c, v,
                                  chunk, scratch.data(), dh.data(), dw.data());
  for (float x : dh) EXPECT_EQ(x, 0.f);
  EXPECT_EQ(dw, dw0);
}

TEST_P(OpsTest, SumSquares) {
  uint64_t seed = 700;
  for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{100003}, size_t{1} << 20}) {
    auto g = RandomVec(n, seed++, -3, 3);
    const double r = ref_->sum_squares(g.data(), n);
    const double c = cpu_->sum_squares(g.data(), n);
    EXPECT_NEAR(c, r, 1e-12 * std::max(1.0, r)) << n;
  }
}

TEST_P(OpsTest, AdamW) {
  uint64_t seed = 800;
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{100003}}) {
    auto p_ref = RandomVec(n, seed++), m_ref = RandomVec(n, seed++, -0.1, 0.1),
         v_ref = RandomVec(n, seed++, 0, 0.01);
    auto p_cpu = p_ref, m_cpu = m_ref, v_cpu = v_ref;
    const auto p0 = p_ref;
    for (int64_t step = 1; step <= 3; ++step) {
      auto g = RandomVec(n, seed++);
      ref_->adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 0.05f,
                       0.9f, 0.95f, 1e-8f, 0.1f, step);
      cpu_->adamw_step(p_cpu.data(), g.data(), m_cpu.data(), v_cpu.data(), n, 0.05f,
                       0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
    EXPECT_LE(Track("AdamW.p", RelErr(p_cpu, p_ref)), kTol) << n;
    EXPECT_LE(Track("AdamW.m", RelErr(m_cpu, m_ref)), kTol) << n;
    EXPECT_LE(Track("AdamW.v", RelErr(v_cpu, v_ref)), kTol) << n;
    // The update itself (p - p0) to 1e-4: its float rounding is ulp(p) / |dp|.
    std::vector<double> d_cpu(n), d_ref(n);
    for (size_t i = 0; i < n; ++i) {
      d_cpu[i] = static_cast<double>(p_cpu[i]) - p0[i];
      d_ref[i] = static_cast<double>(p_ref[i]) - p0[i];
    }
    EXPECT_LE(Track("AdamW.d", RelErr(d_cpu, d_ref)), 1e-4) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, OpsTest, ::testing::Values(2, 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "threads";
                         });

}  // namespace
}  // namespace tandem::kernels
