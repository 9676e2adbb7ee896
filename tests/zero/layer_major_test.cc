// Layer-major gradient accumulation (worker/model/layer_major.h) against
// ordinary micro-batch accumulation on the tiny Llama model of the ZeRO
// tests, N = 2 ranks as threads over Gloo on 127.0.0.1, M = 4 micro-batches
// per rank and step, stages 0-3:
//  * Stages 0-1 (untied embeddings): the parameters after every step are
//    bit-identical (each unit's buffer takes the micro-batches in the same
//    order; one allreduce per unit instead of one for all units sums the
//    same two values per element).
//  * Stages 2-3, and the tied model at every stage: within 1e-5 relative
//    (the local sum of M micro-batches is reduced once, instead of M
//    reduced pieces being summed).
//  * Stages 2-3 reduce-scatter exactly 1/M of the bytes per step; stage 3
//    allgathers (M + 1) / (2 M) of them (the backward gathers each unit
//    once); stages 0-1 allreduce the same bytes.
//  * A bad call (mismatched spans, no forward) fails with its reason.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/comm/collective.h"
#include "worker/model/layer_major.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using ::tandem::testing::RunRanks;
using test_model::kPrompt;
using test_model::MakeSequence;
using test_model::TinyConfig;
using test_model::UnitsOf;

constexpr int kSteps = 4;
constexpr int kRanks = 2;
constexpr int kMicro = 4;                // micro-batches per rank and step
constexpr int kBatch = kRanks * kMicro;  // one sequence per micro-batch
constexpr float kLr = 3e-3f, kClip = 1.0f;

struct RunResult {
  std::vector<std::vector<float>> params;  // after each step (rank 0)
  std::vector<double> grad_norms;
  // Adam's first moment after step 1 (rank 0's shard): (1 - beta1) times
  // the clipped step-1 gradient, so it compares the gradients themselves.
  std::vector<float> m1;
  comm::ByteCount rs, ag, ar;  // rank 0, over all steps
};

RunResult Train(int stage, bool layer_major, bool tied) {
  model::ModelConfig config = TinyConfig();
  config.tie_word_embeddings = tied;
  std::vector<double> tokens(kSteps, 0);
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < kBatch; ++i) tokens[s] += MakeSequence(s, i, config.vocab_size).size() - kPrompt;
  }
  RunResult out;
  RunRanks(kRanks, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    std::vector<std::unique_ptr<model::Model>> models;
    for (int m = 0; m < (layer_major ? kMicro : 1); ++m) {
      models.push_back(std::make_unique<model::Model>(config, ops.get(), 64));
    }
    ZeroOptions o;
    o.stage = stage;
    o.units = UnitsOf(models[0]->layout());
    o.comm = &c;
    o.ops = ops.get();
    o.adamw = {0.9f, 0.95f, 1e-8f, 0.01f};
    o.reduce_on_release = layer_major;
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    std::vector<float> init(models[0]->layout().total_floats());
    models[0]->InitParams(42, init.data());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    c.ResetBytes();
    std::vector<std::vector<float>> dlogp(kMicro);
    std::vector<model::BackwardOptions> bopts(kMicro);
    for (int s = 0; s < kSteps; ++s) {
      z.ZeroGrads();
      for (int mb = 0; mb < kMicro; ++mb) {
        const int i = mb * kRanks + c.rank();  // sample i goes to rank i % N
        const auto seq = MakeSequence(s, i, config.vocab_size);
        model::Batch batch;
        batch.AddSequence(seq);
        const int t = batch.num_tokens();
        std::vector<float> logp(t);
        dlogp[mb].assign(t, 0.f);
        for (int k = 0; k < t; ++k) {
          if (k + 1 >= kPrompt) dlogp[mb][k] = static_cast<float>(-1.0 / tokens[s]);
        }
        model::Model& m = *models[layer_major ? mb : 0];
        ASSERT_TRUE(m.ForwardLogprobs(batch, z, logp.data()).ok());
        if (!layer_major) ASSERT_TRUE(m.Backward(dlogp[mb].data(), z).ok());
        ASSERT_TRUE(z.status().ok()) << z.status();
      }
      if (layer_major) {
        std::vector<model::Model*> ms;
        std::vector<const float*> ds;
        for (int mb = 0; mb < kMicro; ++mb) {
          ms.push_back(models[mb].get());
          ds.push_back(dlogp[mb].data());
        }
        ASSERT_TRUE(model::LayerMajorBackward(ms, ds, bopts, z).ok());
        ASSERT_TRUE(z.status().ok()) << z.status();
      }
      auto r = z.Step(kLr, kClip);
      ASSERT_TRUE(r.ok()) << r.status();
      std::vector<float> full(z.num_params());
      ASSERT_TRUE(z.GatherFull(full.data()).ok());
      if (c.rank() == 0 && s == 0) {
        const size_t n = stage == 0 ? z.num_params() : z.shard_size();
        out.m1.resize(n);
        std::vector<float> v(n);
        z.CopyOptimizerShard(out.m1.data(), v.data());
      }
      if (c.rank() == 0) {
        out.params.push_back(std::move(full));
        out.grad_norms.push_back(r->grad_norm);
      }
    }
    if (c.rank() == 0) {
      // GatherFull's allgathers (stage 3) are the same in both runs.
      out.rs = c.bytes(comm::CollectiveKind::kReduceScatter);
      out.ag = c.bytes(comm::CollectiveKind::kAllgather);
      out.ar = c.bytes(comm::CollectiveKind::kAllreduce);
    }
  });
  return out;
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst;
}

// max |a - b| / max |a|.
double NormRel(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0;
  for (float x : a) scale = std::max(scale, std::fabs(double(x)));
  return scale == 0 ? MaxAbs(a, b) : MaxAbs(a, b) / scale;
}

TEST(LayerMajor, MatchesMicroBatchAccumulationAtEveryStage) {
  for (bool tied : {false, true}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const RunResult plain = Train(stage, false, tied);
      const RunResult lm = Train(stage, true, tied);
      ASSERT_EQ(plain.params.size(), static_cast<size_t>(kSteps));
      ASSERT_EQ(lm.params.size(), static_cast<size_t>(kSteps));
      double worst = 0;
      bool identical = true;
      for (int s = 0; s < kSteps; ++s) {
        ASSERT_EQ(plain.params[s].size(), lm.params[s].size());
        identical = identical && std::memcmp(plain.params[s].data(), lm.params[s].data(),
                                             plain.params[s].size() * sizeof(float)) == 0;
        worst = std::max(worst, MaxAbs(plain.params[s], lm.params[s]));
        EXPECT_LE(std::fabs(plain.grad_norms[s] - lm.grad_norms[s]), 1e-5 * plain.grad_norms[s])
            << "stage " << stage << " step " << s + 1;
      }
      ASSERT_EQ(plain.m1.size(), lm.m1.size());
      const double grad_rel = NormRel(plain.m1, lm.m1);
      std::printf(
          "[layer-major] %s stage %d: params %s (max abs diff %.3g after %d steps), step-1 gradient max diff / "
          "max %.3g; rank 0 bytes sent over %d steps: reduce_scatter %llu -> %llu, allgather %llu -> %llu, "
          "allreduce %llu -> %llu\n",
          tied ? "tied" : "untied", stage, identical ? "bit-identical" : "differ", worst, kSteps, grad_rel, kSteps,
          static_cast<unsigned long long>(plain.rs.sent), static_cast<unsigned long long>(lm.rs.sent),
          static_cast<unsigned long long>(plain.ag.sent), static_cast<unsigned long long>(lm.ag.sent),
          static_cast<unsigned long long>(plain.ar.sent), static_cast<unsigned long long>(lm.ar.sent));
      if (!tied && stage <= 1) {
        EXPECT_TRUE(identical) << "stage " << stage;
      }
      // fp32 summation order only: the gradients agree to a few ulps of
      // their largest entry; Adam turns that into small parameter moves.
      EXPECT_LE(grad_rel, 1e-6) << (tied ? "tied" : "untied") << " stage " << stage;
      EXPECT_LE(worst, 1e-5) << (tied ? "tied" : "untied") << " stage " << stage;
      if (stage >= 2) {
        EXPECT_GT(plain.rs.sent, 0u);
        EXPECT_EQ(plain.rs.sent, kMicro * lm.rs.sent) << "stage " << stage << ": bytes per step / M";
        EXPECT_EQ(plain.rs.calls, kMicro * lm.rs.calls);
      } else {
        // The same gradient crosses once per step in both.
        EXPECT_NEAR(double(lm.ar.sent), double(plain.ar.sent), 0.01 * plain.ar.sent) << "stage " << stage;
      }
      if (stage == 3) EXPECT_LT(lm.ag.sent, plain.ag.sent);
    }
  }
}

TEST(LayerMajor, BadCallsFailWithTheirReason) {
  const model::ModelConfig config = TinyConfig();
  auto ops = kernels::MakeReferenceOps();
  model::Model m(config, ops.get(), 64);
  std::vector<float> params(m.layout().total_floats());
  m.InitParams(1, params.data());
  // A provider over full host vectors (no reduction).
  struct Full : model::ParamProvider {
    std::vector<float>* p;
    std::vector<float> g;
    std::vector<size_t> off;
    const float* AcquireParams(int u) override { return p->data() + off[u]; }
    void ReleaseParams(int) override {}
    float* AcquireGrads(int u) override { return g.data() + off[u]; }
    void ReleaseGrads(int) override {}
  } pp;
  pp.p = &params;
  pp.g.assign(params.size(), 0.f);
  for (int u = 0; u < m.layout().num_units(); ++u) pp.off.push_back(m.layout().unit_offset(u));
  std::vector<model::Model*> ms = {&m};
  std::vector<float> d(4, 0.f);
  std::vector<const float*> ds = {d.data(), d.data()};
  std::vector<model::BackwardOptions> bo(1);
  absl::Status s = model::LayerMajorBackward(ms, ds, bo, pp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("1 models, 2 gradients"), std::string::npos) << s;
  ds.pop_back();
  s = model::LayerMajorBackward(ms, ds, bo, pp);  // no forward yet
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("without a ForwardLogprobs"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::zero
