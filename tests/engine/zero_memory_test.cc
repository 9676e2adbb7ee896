// ZeRO memory per rank: the param/grad/optimizer bytes every rank
// reports from PHASE_SETUP match the fp32 formulas of zero_optimizer.h
//   stage 0: 4Ψ + 4Ψ + 8Ψ          = 16Ψ
//   stage 1: 4Ψ + 4Ψ + 8Ψ/N        = 8Ψ + 8Ψ/N
//   stage 2: 4Ψ + 4Ψ/N + 8Ψ/N      = 4Ψ + 12Ψ/N
//   stage 3: 4Ψ/N + 4Ψ/N + 8Ψ/N    = 16Ψ/N
// within 5% plus a fixed overhead (the uneven split of each unit gives some
// ranks one element more per unit), for N = 1..4. Prints the table.
#include <cstdio>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

struct Expected {
  double param, grad, opt;
};

Expected Formula(int stage, int world, double psi) {
  const double n = world;
  switch (stage) {
    case 0:
      return {4 * psi, 4 * psi, 8 * psi};
    case 1:
      return {4 * psi, 4 * psi, 8 * psi / n};
    case 2:
      return {4 * psi, 4 * psi / n, 8 * psi / n};
    default:
      return {4 * psi / n, 4 * psi / n, 8 * psi / n};
  }
}

void ExpectNear(double got, double want, const std::string& what) {
  const double slack = 0.05 * want + 4096;  // 5% + fixed overhead
  EXPECT_LE(std::fabs(got - want), slack) << what << ": got " << got << " want " << want;
}

class ZeroMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(ZeroMemoryTest, PerRankBytesMatchFormulas) {
  const int world = GetParam();
  EngineCluster cluster(world);
  for (int stage = 0; stage <= 3; ++stage) {
    const JobSpec spec =
        ParseSpec(TinySftYaml(), {"cluster.zero_stage=" + std::to_string(stage), "train.global_batch=24"});
    auto res = cluster.Setup(spec);
    double sum_total = 0, psi = 0;
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(res[r].status.ok()) << res[r].status;
      const auto& v = res[r].report.values();
      ASSERT_TRUE(v.contains("num_params") && v.contains("param_bytes") && v.contains("grad_bytes") &&
                  v.contains("optimizer_bytes"));
      psi = v.at("num_params");
      const Expected e = Formula(stage, world, psi);
      const std::string tag =
          "N=" + std::to_string(world) + " stage " + std::to_string(stage) + " rank " + std::to_string(r);
      ExpectNear(v.at("param_bytes"), e.param, tag + " params");
      ExpectNear(v.at("grad_bytes"), e.grad, tag + " grads");
      ExpectNear(v.at("optimizer_bytes"), e.opt, tag + " optimizer");
      const double total = v.at("param_bytes") + v.at("grad_bytes") + v.at("optimizer_bytes");
      ExpectNear(total, e.param + e.grad + e.opt, tag + " total");
      sum_total += total;
      if (r == 0) {
        std::printf(
            "[zero-memory] N=%d stage=%d psi=%.0f rank0: params %.0f grads %.0f "
            "optimizer %.0f total %.0f B = %.3f psi (formula %.3f psi)\n",
            world, stage, psi, v.at("param_bytes"), v.at("grad_bytes"), v.at("optimizer_bytes"), total, total / psi,
            (e.param + e.grad + e.opt) / psi);
      }
    }
    // Sharded parts add up exactly over the ranks: nothing lost or doubled.
    const Expected e = Formula(stage, world, psi);
    EXPECT_DOUBLE_EQ(sum_total, world * (e.param + e.grad + e.opt)) << "N=" << world << " stage " << stage;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZeroMemoryTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("N", info.param); });

}  // namespace
}  // namespace tandem::enginetest
