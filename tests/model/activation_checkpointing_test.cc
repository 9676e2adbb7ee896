// Activation checkpointing (Model::set_activation_checkpointing, the job key
// train.activation_checkpointing): in the selective and layer modes the
// log-probs, every parameter gradient and the provider's Acquire/Release
// sequence are bit-identical to no checkpointing (the backward recomputes
// with the forward's very kernel calls), on Qwen2-style (q/k/v biases,
// untied head) and Qwen3-style (q/k norms, tied) models, with the reference
// and the fast CPU ops, alone and with the cheap-backward options; the bytes
// the model holds for saved activations (its own allocation accounting)
// fall from none to selective to layer. Bad mode names are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/activation_checkpointing.h"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"

namespace tandem::model {
namespace {

constexpr ActivationCheckpointing kModes[] = {ActivationCheckpointing::kNone, ActivationCheckpointing::kSelective,
                                              ActivationCheckpointing::kLayer};

ModelConfig MakeConfig(const std::string& type, bool tied) {
  nlohmann::json j = {
      {"vocab_size", 29},         {"hidden_size", 32},        {"intermediate_size", 48},       {"num_hidden_layers", 3},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},    {"model_type", type},       {"tie_word_embeddings", tied}};
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

class LoggingProvider : public ParamProvider {
 public:
  LoggingProvider(const ParamLayout& l, const float* p, float* g) : l_(l), p_(p), g_(g) {}
  const float* AcquireParams(int u) override {
    log += "P" + std::to_string(u) + " ";
    return p_ + l_.unit_offset(u);
  }
  void ReleaseParams(int u) override { log += "p" + std::to_string(u) + " "; }
  float* AcquireGrads(int u) override {
    log += "G" + std::to_string(u) + " ";
    return g_ + l_.unit_offset(u);
  }
  void ReleaseGrads(int u) override { log += "g" + std::to_string(u) + " "; }
  std::string log;

 private:
  const ParamLayout& l_;
  const float* p_;
  float* g_;
};

struct Result {
  std::vector<float> logp, grads;
  std::string log;
  size_t saved_bytes = 0, activation_bytes = 0;
};

struct Case {
  std::string type;
  bool tied;
  bool fast_ops;
};

class ActivationCheckpointingTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    config_ = MakeConfig(GetParam().type, GetParam().tied);
    ops_ = GetParam().fast_ops ? kernels::MakeCpuOps(2) : kernels::MakeReferenceOps();
    Model probe(config_, ops_.get());
    params_.resize(probe.layout().total_floats());
    probe.InitParams(11, params_.data());
    // Larger weights than the initialisation, so every path matters.
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (const auto& t : probe.layout().tensors()) {
      for (size_t i = 0; i < t.numel; ++i) {
        float& p = params_[t.offset + i];
        if (t.kind == TensorView::Kind::kMatrix) p = static_cast<float>(0.3 * nd(rng));
        if (t.kind == TensorView::Kind::kNorm) p = static_cast<float>(1.0 + 0.2 * nd(rng));
        if (t.kind == TensorView::Kind::kBias) p = static_cast<float>(0.2 * nd(rng));
      }
    }
    const std::vector<int32_t> s1 = {1, 4, 7, 2, 9, 3, 5, 12, 20, 28, 0}, s2 = {2, 8, 8, 1, 6, 10, 17};
    batch_.AddSequence(s1);
    batch_.AddSequence(s2);
    for (int i = 0; i < batch_.num_tokens(); ++i) dlogp_.push_back(static_cast<float>(nd(rng)));
  }

  // One forward and backward on a fresh model in `mode` (twice, so the
  // second pass runs on a reused workspace).
  Result Run(ActivationCheckpointing mode, const ForwardOptions& fo = {}, const BackwardOptions& bo = {}) {
    Model m(config_, ops_.get());
    m.set_activation_checkpointing(mode);
    Result r;
    for (int pass = 0; pass < 2; ++pass) {
      r.grads.assign(m.layout().total_floats(), 0.f);
      LoggingProvider pp(m.layout(), params_.data(), r.grads.data());
      r.logp.assign(batch_.num_tokens(), 0.f);
      EXPECT_TRUE(m.ForwardLogprobs(batch_, pp, r.logp.data(), nullptr, fo).ok());
      EXPECT_TRUE(m.Backward(dlogp_.data(), pp, bo).ok());
      r.log = pp.log;
    }
    r.saved_bytes = m.saved_activation_bytes();
    r.activation_bytes = m.activation_bytes();
    return r;
  }

  static void ExpectSameBits(const Result& a, const Result& b, const char* what) {
    ASSERT_EQ(a.logp.size(), b.logp.size());
    ASSERT_EQ(a.grads.size(), b.grads.size());
    EXPECT_EQ(0, std::memcmp(a.logp.data(), b.logp.data(), a.logp.size() * sizeof(float))) << what << ": log-probs";
    size_t differ = 0;
    for (size_t i = 0; i < a.grads.size(); ++i) {
      if (std::memcmp(&a.grads[i], &b.grads[i], sizeof(float)) != 0) ++differ;
    }
    EXPECT_EQ(differ, 0u) << what << ": gradient elements that differ";
    EXPECT_EQ(a.log, b.log) << what << ": provider calls";
  }

  ModelConfig config_;
  std::unique_ptr<kernels::Ops> ops_;
  std::vector<float> params_;
  Batch batch_;
  std::vector<float> dlogp_;
};

TEST_P(ActivationCheckpointingTest, GradientsAreBitIdenticalToNoCheckpointing) {
  const Result none = Run(ActivationCheckpointing::kNone);
  double norm = 0;
  for (float g : none.grads) norm += static_cast<double>(g) * g;
  ASSERT_GT(norm, 0);
  for (ActivationCheckpointing mode : kModes) {
    ExpectSameBits(none, Run(mode), ActivationCheckpointingName(mode));
  }
}

TEST_P(ActivationCheckpointingTest, CombinesWithTheCheapBackwardOptions) {
  ForwardOptions fo;
  fo.recompute_mlp = true;
  BackwardOptions skip;
  skip.skip_attention = true;
  BackwardOptions low_rank;
  low_rank.low_rank = 4;
  low_rank.low_rank_seed = 99;
  const Result none_fo = Run(ActivationCheckpointing::kNone, fo);
  const Result none_skip = Run(ActivationCheckpointing::kNone, {}, skip);
  const Result none_lr = Run(ActivationCheckpointing::kNone, {}, low_rank);
  for (ActivationCheckpointing mode : kModes) {
    const std::string name = ActivationCheckpointingName(mode);
    ExpectSameBits(none_fo, Run(mode, fo), (name + " + recompute_mlp").c_str());
    ExpectSameBits(none_skip, Run(mode, {}, skip), (name + " + skip_attention").c_str());
    ExpectSameBits(none_lr, Run(mode, {}, low_rank), (name + " + low_rank").c_str());
  }
}

TEST_P(ActivationCheckpointingTest, SavedActivationBytesFall) {
  const Result none = Run(ActivationCheckpointing::kNone);
  const Result selective = Run(ActivationCheckpointing::kSelective);
  const Result layer = Run(ActivationCheckpointing::kLayer);
  EXPECT_LT(selective.saved_bytes, none.saved_bytes);
  EXPECT_LT(layer.saved_bytes, selective.saved_bytes);
  EXPECT_LT(selective.activation_bytes, none.activation_bytes);
  EXPECT_LT(layer.activation_bytes, selective.activation_bytes);
  // Layer keeps the residual stream (L + 1 rows of hidden_size floats per
  // token) and nothing else per layer.
  const size_t T = batch_.num_tokens(), L = config_.num_hidden_layers, C = config_.hidden_size;
  const size_t x_floats = ((L + 1) * T * C + 15) / 16 * 16;
  EXPECT_EQ(layer.saved_bytes, x_floats * sizeof(float));
}

INSTANTIATE_TEST_SUITE_P(Models, ActivationCheckpointingTest,
                         ::testing::Values(Case{"qwen2", false, false}, Case{"qwen3", true, false},
                                           Case{"qwen2", false, true}, Case{"qwen3", true, true}),
                         [](const auto& info) {
                           return info.param.type + (info.param.tied ? "_tied" : "_untied") +
                                  (info.param.fast_ops ? "_cpu" : "_reference");
                         });

TEST(ActivationCheckpointingParse, NamesAndBadValues) {
  for (ActivationCheckpointing mode : kModes) {
    auto parsed = ParseActivationCheckpointing(ActivationCheckpointingName(mode));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, mode);
  }
  auto empty = ParseActivationCheckpointing("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, ActivationCheckpointing::kNone);
  for (const char* bad : {"full", "Layer", "layers", " none"}) {
    auto parsed = ParseActivationCheckpointing(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("expected none, selective or layer"), std::string::npos)
        << parsed.status();
    EXPECT_NE(parsed.status().message().find("train.activation_checkpointing"), std::string::npos);
  }
}

}  // namespace
}  // namespace tandem::model
