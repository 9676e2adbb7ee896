// configs/sft-arith-tiny.yaml stays valid and trains: it parses with the
// job-file reader, and its first steps run through the engine with falling
// loss. TANDEM_SFT_CONFIG_FULL=1 runs every step and evaluates as the
// coordinator's phase plan does (eval every train.eval_every steps).
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

TEST(SftConfigTest, TinyArithmeticConfigTrains) {
  auto spec = common::LoadJobSpecFile(std::string(TANDEM_SOURCE_DIR) + "/configs/sft-arith-tiny.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const bool full = std::getenv("TANDEM_SFT_CONFIG_FULL") != nullptr;
  const int steps = full ? spec->train().steps() : 30;
  EngineCluster c(spec->cluster().workers());
  c.SetupOk(*spec);
  const auto start = std::chrono::steady_clock::now();
  double first = 0, last = 0;
  for (int s = 1; s <= steps; ++s) {
    auto rep = c.RunOk(tandem::v1::PHASE_SFT_STEP, s);
    if (s == 1) first = rep.metrics().loss();
    last = rep.metrics().loss();
    if (full && (s % spec->train().eval_every() == 0 || s == steps)) {
      auto ev = c.RunOk(tandem::v1::PHASE_EVAL, s);
      std::printf("[sft-config] step %d loss %.4f held-out accuracy %.3f (%.1f s)\n", s, last, ev.metrics().accuracy(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::printf("[sft-config] %d steps: loss %.4f -> %.4f\n", steps, first, last);
  EXPECT_LT(last, 0.8 * first);
}

}  // namespace
}  // namespace tandem::enginetest
