// Model::Backward with BackwardOptions (MeCeFO's cheap backward).
// skip_attention: the attention sub-blocks' parameters get no gradient,
// the last layer's MLP, the final norm and the LM head get exactly the full
// backward's gradients (nothing skipped lies between them and the loss), the
// provider sees the same Acquire/Release sequence (ZeRO's collectives pair),
// and for a 1-layer model whose attention contributes nothing (o_proj = 0)
// every gradient but o_proj's equals the full backward's.
// ForwardOptions.recompute_mlp: bit-identical log-probs and gradients (the
// reference and the fast CPU ops, with and without skip_attention), and a
// smaller workspace. low_rank: only the gate/up/down gradients change; their
// relative error is at most 1, falls as the rank grows and is ~0 at full
// rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"

namespace tandem::model {
namespace {

ModelConfig MakeConfig(int layers) {
  nlohmann::json j = {{"vocab_size", 13},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"max_position_embeddings", 64},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 10000.0},
                      {"model_type", "qwen2"},
                      {"tie_word_embeddings", false}};
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

class LoggingProvider : public ParamProvider {
 public:
  LoggingProvider(const ParamLayout& l, float* p, float* g) : l_(l), p_(p), g_(g) {}
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
  float* p_;
  float* g_;
};

struct Grads {
  std::vector<float> g, logp;
  std::string log;
};

// Random parameters (o_proj zeroed when zero_o), one forward, one backward.
class BackwardOptionsTest : public ::testing::Test {
 protected:
  void Init(int layers, bool zero_o, bool fast_ops = false) {
    config_ = MakeConfig(layers);
    ops_ = fast_ops ? kernels::MakeCpuOps(2) : kernels::MakeReferenceOps();
    model_ = std::make_unique<Model>(config_, ops_.get());
    const ParamLayout& l = model_->layout();
    params_.assign(l.total_floats(), 0.f);
    std::mt19937_64 rng(7);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (const auto& t : l.tensors()) {
      const bool is_o = t.name.find("o_proj") != std::string::npos;
      for (size_t i = 0; i < t.numel; ++i) {
        double v = nd(rng);
        switch (t.kind) {
          case TensorView::Kind::kMatrix:
            v *= 0.35;
            break;
          case TensorView::Kind::kNorm:
            v = 1.0 + 0.2 * v;
            break;
          case TensorView::Kind::kBias:
            v *= 0.2;
            break;
        }
        params_[t.offset + i] = zero_o && is_o ? 0.f : static_cast<float>(v);
      }
    }
    std::vector<int32_t> s1 = {1, 4, 7, 2, 9, 3, 5, 12}, s2 = {2, 8, 8, 1, 6, 10};
    batch_.AddSequence(s1);
    batch_.AddSequence(s2);
    dlogp_.resize(batch_.num_tokens());
    for (float& d : dlogp_) d = static_cast<float>(nd(rng));
  }

  Grads Run(bool skip, bool recompute = false, int low_rank = 0) {
    Grads out;
    out.g.assign(model_->layout().total_floats(), 0.f);
    LoggingProvider pp(model_->layout(), params_.data(), out.g.data());
    out.logp.resize(batch_.num_tokens());
    ForwardOptions fo;
    fo.recompute_mlp = recompute;
    EXPECT_TRUE(model_->ForwardLogprobs(batch_, pp, out.logp.data(), nullptr, fo).ok());
    BackwardOptions bo;
    bo.skip_attention = skip;
    bo.low_rank = low_rank;
    bo.low_rank_seed = 1234;
    EXPECT_TRUE(model_->Backward(dlogp_.data(), pp, bo).ok());
    out.log = pp.log;
    return out;
  }

  static bool IsFfnMatrix(const std::string& name) {
    return name.find("mlp.") != std::string::npos && name.find("_proj") != std::string::npos;
  }

  static bool IsAttention(const std::string& name) {
    return name.find("self_attn.") != std::string::npos || name.find("input_layernorm") != std::string::npos;
  }

  double MaxAbs(const std::vector<float>& g, const TensorView& t) const {
    double m = 0;
    for (size_t i = 0; i < t.numel; ++i) m = std::max(m, std::fabs(static_cast<double>(g[t.offset + i])));
    return m;
  }

  double MaxDiff(const Grads& a, const Grads& b, const TensorView& t) const {
    double m = 0;
    for (size_t i = 0; i < t.numel; ++i) {
      m = std::max(m, std::fabs(static_cast<double>(a.g[t.offset + i]) - b.g[t.offset + i]));
    }
    return m;
  }

  ModelConfig config_;
  std::unique_ptr<kernels::Ops> ops_;
  std::unique_ptr<Model> model_;
  std::vector<float> params_, dlogp_;
  Batch batch_;
};

TEST_F(BackwardOptionsTest, SkipAttentionLeavesAttentionGradsZero) {
  Init(/*layers=*/2, /*zero_o=*/false);
  const Grads full = Run(false);
  const Grads cheap = Run(true);
  EXPECT_EQ(cheap.log, full.log) << "the provider call sequence must not change";
  const std::string last = "model.layers." + std::to_string(config_.num_hidden_layers - 1) + ".";
  int attention_tensors = 0;
  for (const auto& t : model_->layout().tensors()) {
    if (IsAttention(t.name)) {
      ++attention_tensors;
      EXPECT_GT(MaxAbs(full.g, t), 0) << t.name << " (full backward)";
      EXPECT_EQ(MaxAbs(cheap.g, t), 0) << t.name;
    } else if (t.name.rfind(last, 0) == 0 || t.name == "model.norm.weight" || t.name == "lm_head.weight") {
      // Computed before anything is skipped: bit-identical.
      EXPECT_EQ(MaxDiff(cheap, full, t), 0) << t.name;
    } else {
      // Earlier MLPs and the embedding get the approximate residual
      // gradient: nonzero, and different from the exact one.
      EXPECT_GT(MaxAbs(cheap.g, t), 0) << t.name;
      EXPECT_GT(MaxDiff(cheap, full, t), 0) << t.name;
    }
  }
  // q, k, v, o, their 3 biases and the input norm, per layer.
  EXPECT_EQ(attention_tensors, 8 * config_.num_hidden_layers);
}

TEST_F(BackwardOptionsTest, EqualsFullBackwardWhenAttentionContributesNothing) {
  Init(/*layers=*/1, /*zero_o=*/true);
  const Grads full = Run(false);
  const Grads cheap = Run(true);
  for (const auto& t : model_->layout().tensors()) {
    if (t.name.find("o_proj") != std::string::npos) {
      // The only attention parameter the exact backward reaches.
      EXPECT_GT(MaxAbs(full.g, t), 0) << t.name;
      EXPECT_EQ(MaxAbs(cheap.g, t), 0) << t.name;
      continue;
    }
    const double scale = std::max(1e-30, MaxAbs(full.g, t));
    EXPECT_LE(MaxDiff(cheap, full, t), 1e-6 * std::max(1.0, scale)) << t.name;
    if (!IsAttention(t.name)) EXPECT_GT(MaxAbs(cheap.g, t), 0) << t.name;
  }
}

TEST_F(BackwardOptionsTest, RecomputedMlpGivesBitIdenticalGradients) {
  for (bool fast : {false, true}) {
    Init(/*layers=*/3, /*zero_o=*/false, fast);
    for (bool skip : {false, true}) {
      const Grads stored = Run(skip);
      const Grads recomputed = Run(skip, /*recompute=*/true);
      EXPECT_EQ(recomputed.log, stored.log);
      ASSERT_EQ(recomputed.logp.size(), stored.logp.size());
      for (size_t t = 0; t < stored.logp.size(); ++t) EXPECT_EQ(recomputed.logp[t], stored.logp[t]) << t;
      size_t differ = 0;
      for (size_t i = 0; i < stored.g.size(); ++i) differ += recomputed.g[i] != stored.g[i];
      EXPECT_EQ(differ, 0u) << (fast ? "fast" : "reference") << " ops, skip_attention " << skip;
      // And the stored path still works after a recomputed forward.
      const Grads again = Run(skip);
      EXPECT_EQ(again.g, stored.g);
    }
  }
}

TEST_F(BackwardOptionsTest, RecomputedMlpKeepsNoMlpActivations) {
  Init(/*layers=*/3, /*zero_o=*/false);
  Model recompute_only(config_, ops_.get());
  std::vector<float> g(model_->layout().total_floats(), 0.f);
  LoggingProvider pp(model_->layout(), params_.data(), g.data());
  std::vector<float> logp(batch_.num_tokens());
  ForwardOptions fo;
  fo.recompute_mlp = true;
  ASSERT_TRUE(recompute_only.ForwardLogprobs(batch_, pp, logp.data(), nullptr, fo).ok());
  ASSERT_TRUE(recompute_only.Backward(dlogp_.data(), pp).ok());
  const size_t lean = recompute_only.workspace_bytes();
  ASSERT_TRUE(recompute_only.ForwardLogprobs(batch_, pp, logp.data()).ok());
  const size_t full = recompute_only.workspace_bytes();
  const size_t mlp = 2 * sizeof(float) * config_.num_hidden_layers * static_cast<size_t>(batch_.num_tokens()) *
                     config_.intermediate_size;
  EXPECT_EQ(full - lean, mlp) << "the stored path keeps 2 L T I floats more";
  std::printf("[backward options] workspace for %d tokens: %zu bytes recomputing the MLP, %zu storing it\n",
              batch_.num_tokens(), lean, full);
}

TEST_F(BackwardOptionsTest, LowRankFfnGradientsErrorShrinksWithRank) {
  Init(/*layers=*/2, /*zero_o=*/false);
  const Grads exact = Run(false);
  double previous = 2;
  for (int r : {1, 2, 4, 8, 12, 16}) {
    const Grads approx = Run(false, /*recompute=*/r % 2 == 0, r);
    EXPECT_EQ(approx.log, exact.log);
    double err2 = 0, ref2 = 0;
    for (const auto& t : model_->layout().tensors()) {
      if (!IsFfnMatrix(t.name)) {
        EXPECT_EQ(MaxDiff(approx, exact, t), 0) << t.name << " at rank " << r;
        continue;
      }
      double e2 = 0, n2 = 0;
      for (size_t i = 0; i < t.numel; ++i) {
        const double d = static_cast<double>(approx.g[t.offset + i]) - exact.g[t.offset + i];
        e2 += d * d;
        n2 += static_cast<double>(exact.g[t.offset + i]) * exact.g[t.offset + i];
      }
      EXPECT_LE(std::sqrt(e2 / n2), 1.0 + 1e-5) << t.name << " at rank " << r;  // a projection
      err2 += e2;
      ref2 += n2;
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("[backward options] low-rank FFN gradients, rank %2d of %d: relative error %.3g\n", r,
                config_.hidden_size, rel);
    EXPECT_LT(rel, previous) << "rank " << r;  // nested subspaces: the error falls
    if (r < config_.hidden_size) EXPECT_GT(rel, 1e-3) << "rank " << r;
    previous = rel;
  }
  EXPECT_LT(previous, 1e-5) << "full rank is the exact gradient up to rounding";
}

}  // namespace
}  // namespace tandem::model
