// Shared by the rollout engine tests: a model with random weights and its
// training forward, the check of generated tokens against recomputing that
// full forward at every step, and the tokens of a result.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "tests/rollout/tp_test_util.h"
#include "worker/model/model.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout::enginetest {

// A model config with random weights (tptest::RandomParams) on `ops`.
struct ModelFixture {
  ModelFixture(model::ModelConfig c, kernels::Ops* ops_in, uint64_t seed)
      : config(std::move(c)), ops(ops_in), m(config, ops), params(tptest::RandomParams(config, seed)) {
    pp = std::make_unique<model::FlatParamProvider>(m.layout(), params.data(), nullptr);
  }
  model::ModelConfig config;
  kernels::Ops* ops;
  model::Model m;
  std::vector<float> params;
  std::unique_ptr<model::FlatParamProvider> pp;
};

// The logits of every position of `seq`, recomputed by the training
// model's full forward (the reference the engine's tokens are checked on).
inline bool FullForwardLogits(ModelFixture& f, const std::vector<int32_t>& seq, std::vector<float>* logits) {
  model::Batch b;
  b.cu_seqlens = {0, static_cast<int32_t>(seq.size())};
  for (size_t i = 0; i < seq.size(); ++i) {
    b.tokens.push_back(seq[i]);
    b.targets.push_back(0);
    b.positions.push_back(static_cast<int32_t>(i));
  }
  logits->assign(seq.size() * static_cast<size_t>(f.config.vocab_size), 0.f);
  return f.m.ForwardLogits(b, *f.pp, logits->data()).ok();
}

// Every greedy token of `res` (generated for `reqs`) is the argmax of the
// full forward's logits at its position, and its raw log-prob theirs
// within 1e-4.
inline void ExpectGreedyTokensOfFullForward(ModelFixture& f, const std::vector<RolloutRequest>& reqs,
                                            const RolloutResult& res) {
  const int V = f.config.vocab_size;
  ASSERT_EQ(res.sequences.size(), reqs.size());
  for (size_t s = 0; s < reqs.size(); ++s) {
    const auto& g = res.sequences[s];
    ASSERT_FALSE(g.tokens.empty()) << "sequence " << s;
    std::vector<int32_t> seq = reqs[s].prompt;
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end() - 1);
    std::vector<float> logits;
    ASSERT_TRUE(FullForwardLogits(f, seq, &logits));
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      const float* row = logits.data() + (reqs[s].prompt.size() - 1 + j) * V;
      int arg = 0;
      for (int v = 1; v < V; ++v) {
        if (row[v] > row[arg]) arg = v;
      }
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(row[v] - row[arg]);
      EXPECT_EQ(g.tokens[j], arg) << "sequence " << s << " token " << j;
      EXPECT_NEAR(g.raw_logprobs[j], row[g.tokens[j]] - row[arg] - std::log(z), 1e-4)
          << "sequence " << s << " token " << j;
    }
  }
}

// Two samples of each of tptest::Requests' prompts, greedy with options
// `o` (no stop ids): every sequence runs to o.max_new_tokens, its tokens are
// the full forward's, and the shared prompts saved prefill.
inline void ExpectGreedyMatchesFullForward(ModelFixture& f, const RolloutOptions& o) {
  RolloutEngine eng(f.config, f.ops);
  const auto reqs = tptest::Requests(2);
  auto res = eng.Generate(reqs, o, *f.pp);
  ASSERT_TRUE(res.ok()) << res.status();
  for (const auto& g : res->sequences) ASSERT_EQ(g.tokens.size(), static_cast<size_t>(o.max_new_tokens));
  ExpectGreedyTokensOfFullForward(f, reqs, *res);
  EXPECT_GT(res->scheduler.prompt_tokens_saved, 0);
}

inline std::vector<std::vector<int32_t>> Tokens(const RolloutResult& r) {
  std::vector<std::vector<int32_t>> t;
  for (const auto& s : r.sequences) t.push_back(s.tokens);
  return t;
}

}  // namespace tandem::rollout::enginetest
