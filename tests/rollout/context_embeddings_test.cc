// Context embeddings in the rollout engine (RolloutRequest.context): rows
// equal to the model's own embedding rows of some tokens give exactly the
// output of those tokens (prefix, whole prompt, sampled, mixed batches,
// preemption; without a repetition penalty, which only sees token ids);
// bad embeddings fail with a clear error and leave the engine usable.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/rollout/engine.h"

namespace tandem::rollout {
namespace {

model::ModelConfig Config() {
  nlohmann::json j = {
      {"model_type", "qwen2"},  {"vocab_size", 29},         {"hidden_size", 32},        {"intermediate_size", 40},
      {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 48},
      {"eos_token_id", 2},      {"bos_token_id", 1}};
  auto c = model::ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

struct Fixture {
  explicit Fixture(kernels::Ops* ops_in) : config(Config()), ops(ops_in), m(config, ops) {
    params.assign(m.layout().total_floats(), 0.f);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> nd;
    for (const auto& t : m.layout().tensors()) {
      for (size_t i = 0; i < t.numel; ++i) {
        const float v = nd(rng);
        params[t.offset + i] = t.kind == model::TensorView::Kind::kNorm   ? 1.f + 0.1f * v
                               : t.kind == model::TensorView::Kind::kBias ? 0.1f * v
                                                                          : 0.3f * v;
      }
    }
    pp = std::make_unique<model::FlatParamProvider>(m.layout(), params.data(), nullptr);
  }
  // The embedding rows of `tokens`, as context embeddings.
  std::vector<float> Rows(const std::vector<int32_t>& tokens) const {
    const size_t C = config.hidden_size;
    const float* embed = params.data() + m.layout().unit_offset(0) + m.layout().embed_offset();
    std::vector<float> out;
    for (int32_t t : tokens) out.insert(out.end(), embed + t * C, embed + (t + 1) * C);
    return out;
  }
  model::ModelConfig config;
  kernels::Ops* ops;
  model::Model m;
  std::vector<float> params;
  std::unique_ptr<model::FlatParamProvider> pp;
};

RolloutOptions Options(bool greedy) {
  RolloutOptions o;
  o.max_new_tokens = 8;
  o.block_size = 4;
  o.max_batch_tokens = 5;  // chunked prefill across context and tokens
  o.sampling.greedy = greedy;
  o.sampling.temperature = 0.9f;
  o.sampling.seed = 3;
  o.sampling.top_k = 12;
  return o;
}

void ExpectSame(const RolloutSequence& a, const RolloutSequence& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.logprobs, b.logprobs) << what;
  EXPECT_EQ(a.raw_logprobs, b.raw_logprobs) << what;
}

TEST(ContextEmbeddingsTest, EmbeddingRowsEqualTheirTokens) {
  auto ref = kernels::MakeReferenceOps();
  auto cpu = kernels::MakeCpuOps(0);
  for (kernels::Ops* ops : {ref.get(), cpu.get()}) {
    Fixture f(ops);
    RolloutEngine eng(f.config, f.ops);
    const std::vector<int32_t> prompt = {1, 5, 9, 13, 4, 7, 21};
    for (bool greedy : {true, false}) {
      const RolloutOptions o = Options(greedy);
      auto want = eng.Generate({{prompt, -1, 11}}, o, *f.pp);
      ASSERT_TRUE(want.ok()) << want.status();
      for (size_t n : {size_t{1}, size_t{3}, prompt.size()}) {
        RolloutRequest r;
        r.context = f.Rows({prompt.begin(), prompt.begin() + n});
        r.prompt.assign(prompt.begin() + n, prompt.end());
        r.stream = 11;
        auto got = eng.Generate({r}, o, *f.pp);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->context_rows, static_cast<int64_t>(n));
        ExpectSame(got->sequences[0], want->sequences[0],
                   absl::StrCat("n=", n, greedy ? " greedy" : " sampled", " ", f.ops->name()));
      }
    }
  }
}

// Reference ops compute each row alone: batches that mix context requests,
// token requests and a shared group, under a cache small enough to preempt,
// give every sequence its tokens-only output.
TEST(ContextEmbeddingsTest, MixedBatchesAndPreemption) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(ops.get());
  RolloutEngine eng(f.config, f.ops);
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 13}, {1, 20, 3}, {1, 3, 4, 7, 8, 11, 12}};
  std::vector<RolloutRequest> tokens_only, mixed;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int g = 0; g < 2; ++g) {
      const uint64_t stream = p * 2 + g;
      tokens_only.push_back({prompts[p], static_cast<int>(p), stream});
      RolloutRequest r{prompts[p], static_cast<int>(p), stream};
      if (g == 1) {  // the second of each group: its first two tokens as context
        r.context = f.Rows({prompts[p].begin(), prompts[p].begin() + 2});
        r.prompt.erase(r.prompt.begin(), r.prompt.begin() + 2);
      }
      mixed.push_back(r);
    }
  }
  for (size_t kv_blocks : {size_t{0}, size_t{9}}) {
    RolloutOptions o = Options(false);
    o.kv_cache_bytes = kv_blocks * KvPool::BlockBytes(2, 16, o.block_size, o.kv_dtype);
    auto want = eng.Generate(tokens_only, o, *f.pp);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = eng.Generate(mixed, o, *f.pp);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t s = 0; s < mixed.size(); ++s) {
      ExpectSame(got->sequences[s], want->sequences[s], absl::StrCat("sequence ", s));
    }
    if (kv_blocks > 0) {
      EXPECT_GT(got->scheduler.preemptions, 0);
    }
  }
}

TEST(ContextEmbeddingsTest, BadEmbeddingsAreClearErrors) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(ops.get());
  RolloutEngine eng(f.config, f.ops);
  const RolloutOptions o = Options(true);
  auto error_of = [&](RolloutRequest r) {
    auto res = eng.Generate({r}, o, *f.pp);
    EXPECT_FALSE(res.ok());
    EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument) << res.status();
    return std::string(res.status().message());
  };
  RolloutRequest ragged;
  ragged.context.assign(32 * 2 + 5, 0.1f);
  EXPECT_NE(error_of(ragged).find("not rows of the model's hidden size 32"), std::string::npos);
  RolloutRequest too_long;
  too_long.context = f.Rows(std::vector<int32_t>(41, 3));  // 41 + 8 new > 48 positions
  EXPECT_NE(error_of(too_long).find("exceed the model's context of 48 positions"), std::string::npos);
  too_long.context = f.Rows(std::vector<int32_t>(30, 3));
  too_long.prompt.assign(15, 4);  // 30 + 15 + 8 > 48
  EXPECT_NE(error_of(too_long).find("exceed the model's context"), std::string::npos);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    RolloutRequest r;
    r.context = f.Rows({1, 2, 3});
    r.context[32 + 7] = bad;
    const std::string e = error_of(r);
    EXPECT_NE(e.find("context embedding row 1, column 7"), std::string::npos) << e;
    EXPECT_NE(e.find("must be finite"), std::string::npos) << e;
  }
  RolloutRequest empty;
  EXPECT_NE(error_of(empty).find("is empty"), std::string::npos);
  // Still usable afterwards.
  RolloutRequest ok;
  ok.context = f.Rows({1, 5});
  auto res = eng.Generate({ok}, o, *f.pp);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->sequences[0].tokens.size(), 8u);
}

}  // namespace
}  // namespace tandem::rollout
