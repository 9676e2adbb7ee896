// AdamW (both backends) against a two-step example computed with
// torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
// in float64 on PyTorch 1.13; also global-norm clipping arithmetic
// (sum_squares + scale).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "kernels/backends.h"
#include "kernels/ops.h"

namespace tandem::kernels {
namespace {

std::vector<std::unique_ptr<Ops>> Backends() {
  std::vector<std::unique_ptr<Ops>> v;
  v.push_back(MakeReferenceOps());
  v.push_back(MakeCpuOps(2));
  return v;
}

TEST(AdamW, MatchesTorchTwoSteps) {
  const double g1[4] = {0.5, -1.0, 0.0, 2.0};
  const double g2[4] = {-0.25, 0.5, 1e-3, 4.0};
  const double p_after[2][4] = {{0.899000002, -0.399500001, 0.24975, 1.8980000005},
                                {0.8714672987058463, -0.3724667973699032, 0.17508761973368986, 1.7995837982224947}};
  const double m_after[2][4] = {{0.05, -0.1, 0.0, 0.2}, {0.02, -0.04, 1e-4, 0.58}};
  const double v_after[2][4] = {{0.00025, 0.001, 0.0, 0.004}, {0.00031225, 0.001249, 1e-9, 0.019996}};
  for (const auto& ops : Backends()) {
    std::vector<float> p = {1.0f, -0.5f, 0.25f, 2.0f}, m(4, 0.f), v(4, 0.f);
    for (int step = 1; step <= 2; ++step) {
      const double* gd = step == 1 ? g1 : g2;
      std::vector<float> g(gd, gd + 4);
      ops->adamw_step(p.data(), g.data(), m.data(), v.data(), 4, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
      for (int i = 0; i < 4; ++i) {
        // fp32 betas: 0.999f = 0.99900001, so 1 - beta2 (hence v) is off by
        // 1.3e-5 relative from torch's double arithmetic; p by ~1e-7.
        EXPECT_NEAR(p[i], p_after[step - 1][i], 1e-6) << ops->name() << " step " << step;
        EXPECT_NEAR(m[i], m_after[step - 1][i], 1e-6 * std::abs(m_after[step - 1][i]) + 1e-12) << ops->name();
        EXPECT_NEAR(v[i], v_after[step - 1][i], 2e-5 * v_after[step - 1][i] + 1e-15) << ops->name();
      }
    }
  }
}

TEST(GlobalNormClip, SumSquaresThenScale) {
  for (const auto& ops : Backends()) {
    std::vector<float> g = {3.f, 4.f, 0.f, 12.f};  // norm 13
    const double norm = std::sqrt(ops->sum_squares(g.data(), g.size()));
    EXPECT_DOUBLE_EQ(norm, 13.0);
    ops->scale(g.data(), static_cast<float>(1.0 / norm), g.size());
    EXPECT_NEAR(std::sqrt(ops->sum_squares(g.data(), g.size())), 1.0, 1e-7);
  }
}

}  // namespace
}  // namespace tandem::kernels
