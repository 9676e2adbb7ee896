// Activation checkpointing under ZeRO (stage 0 and stage 3 on 2 ranks as
// threads): a few SFT steps of the tiny model in the selective and layer
// modes give bit-identical log-probs at every step and bit-identical final
// fp32 masters to no checkpointing (the recomputation acquires no extra
// parameter units, so the collectives pair the same way), and the model's
// saved-activation bytes fall.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/backends.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/model/activation_checkpointing.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using model::ActivationCheckpointing;
using ::tandem::testing::RunRanks;
using namespace test_model;

constexpr int kSteps = 3;
constexpr int kRanks = 2;

struct RunResult {
  std::vector<float> logp;  // rank 0's, every step
  std::vector<float> masters;
  size_t saved_bytes = 0;
};

RunResult Train(int stage, ActivationCheckpointing mode) {
  const model::ModelConfig config = TinyConfig();
  RunResult out;
  RunRanks(kRanks, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    model::Model m(config, ops.get());
    m.set_activation_checkpointing(mode);
    ZeroOptions o;
    o.stage = stage;
    o.units = UnitsOf(m.layout());
    o.comm = &c;
    o.ops = ops.get();
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    std::vector<float> init(m.layout().total_floats());
    m.InitParams(42, init.data());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    std::vector<float> logps;
    for (int s = 0; s < kSteps; ++s) {
      z.ZeroGrads();
      model::Batch batch;
      for (int i = c.rank() * 2; i < c.rank() * 2 + 2; ++i) batch.AddSequence(MakeSequence(s, i, config.vocab_size));
      const int t = batch.num_tokens();
      std::vector<float> logp(t), dlogp(t, -1.f / 64);
      ASSERT_TRUE(m.ForwardLogprobs(batch, z, logp.data()).ok());
      ASSERT_TRUE(m.Backward(dlogp.data(), z).ok());
      ASSERT_TRUE(z.status().ok()) << z.status();
      auto r = z.Step(0.01f, 1.0f);
      ASSERT_TRUE(r.ok()) << r.status();
      logps.insert(logps.end(), logp.begin(), logp.end());
    }
    std::vector<float> full(z.num_params());
    ASSERT_TRUE(z.GatherFull(full.data()).ok());
    if (c.rank() == 0) {
      out.logp = std::move(logps);
      out.masters = std::move(full);
      out.saved_bytes = m.saved_activation_bytes();
    }
  });
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ZeroCheckpointing, BitIdenticalToNoCheckpointingAtStages0And3) {
  for (int stage : {0, 3}) {
    const RunResult none = Train(stage, ActivationCheckpointing::kNone);
    ASSERT_FALSE(none.masters.empty());
    for (ActivationCheckpointing mode : {ActivationCheckpointing::kSelective, ActivationCheckpointing::kLayer}) {
      const RunResult r = Train(stage, mode);
      EXPECT_TRUE(SameBits(none.logp, r.logp)) << "stage " << stage << " " << model::ActivationCheckpointingName(mode);
      EXPECT_TRUE(SameBits(none.masters, r.masters))
          << "stage " << stage << " " << model::ActivationCheckpointingName(mode);
      EXPECT_LT(r.saved_bytes, none.saved_bytes);
    }
  }
}

}  // namespace
}  // namespace tandem::zero
