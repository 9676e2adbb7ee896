// Tensor-parallel rollout (tp_slice.h, tp_decoder.h): ranks as threads over
// Gloo on 127.0.0.1. TP=2 greedy tokens equal TP=1 (PagedDecoder) and the
// log-probs agree within 1e-4 (fp32: the all-reduce sums the two halves of
// each attention-out and MLP-down product in a different order than one
// GEMM); sampled tokens equal TP=1 for the same seeds; the two-half overlap
// gives the unsplit path's bits (reference kernels); every rank gets the
// same tokens; the KV cache holds only the rank's heads; indivisible shapes
// are refused with the size named.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "tests/support/run_ranks.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/tp_decoder.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::rollout {
namespace {

using model::ModelConfig;

// llama: tied; qwen: biases, a sliding layer, YaRN; qwen3: q/k norms;
// mistral: a window on every layer. 4 heads, 2 kv heads, I = 40.
ModelConfig Config(const std::string& kind, int intermediate = 40) {
  nlohmann::json j = {{"vocab_size", 29},
                      {"hidden_size", 32},
                      {"intermediate_size", intermediate},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-5},
                      {"eos_token_id", 2},
                      {"bos_token_id", 1}};
  if (kind == "qwen3") {
    j["model_type"] = "qwen3";
    j["head_dim"] = 12;
  } else if (kind == "mistral") {
    j["model_type"] = "mistral";
    j["sliding_window"] = 4;
  } else if (kind == "qwen") {
    j["model_type"] = "qwen2";
    j["sliding_window"] = 5;
    j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  } else {
    j["tie_word_embeddings"] = true;
  }
  auto c = model::ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<float> RandomParams(const ModelConfig& config, uint64_t seed) {
  const model::ParamLayout layout(config);
  std::vector<float> params(layout.total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  for (const auto& t : layout.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      const float v = nd(rng);
      params[t.offset + i] = t.kind == model::TensorView::Kind::kNorm   ? 1.f + 0.1f * v
                             : t.kind == model::TensorView::Kind::kBias ? 0.1f * v
                                                                        : 0.3f * v;
    }
  }
  return params;
}

std::vector<RolloutRequest> Requests(int G) {
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 5, 9, 13}, {1, 20}, {1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22}, {1}};
  std::vector<RolloutRequest> r;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int g = 0; g < G; ++g) r.push_back({prompts[p], static_cast<int>(p), p * G + g});
  }
  return r;
}

RolloutOptions Small(bool greedy) {
  RolloutOptions o;
  o.max_new_tokens = 10;
  o.block_size = 4;
  o.max_batch_tokens = 7;  // chunked prefill mixed with decode rows
  o.sampling.greedy = greedy;
  if (!greedy) {
    o.sampling.temperature = 0.9f;
    o.sampling.seed = 42;
  }
  return o;
}

enum class Kernels { kReference, kCpu };

std::unique_ptr<kernels::Ops> MakeOps(Kernels k) {
  return k == Kernels::kReference ? kernels::MakeReferenceOps() : kernels::MakeCpuOps(1);
}

RolloutResult RunTp1(const ModelConfig& config, const std::vector<float>& params, const RolloutOptions& o, Kernels k) {
  auto ops = MakeOps(k);
  const model::ParamLayout layout(config);
  std::vector<float> p = params;
  model::FlatParamProvider pp(layout, p.data(), nullptr);
  RolloutEngine eng(config, ops.get());
  auto res = eng.Generate(Requests(2), o, pp);
  EXPECT_TRUE(res.ok()) << res.status();
  return res.ok() ? *res : RolloutResult{};
}

struct RankOut {
  RolloutResult result;
  TpStats stats;
  int kv_dim = 0;
};

// Every rank of a TP group of `tp` runs the engine over its slice.
std::vector<RankOut> RunTp(int tp, const ModelConfig& config, const std::vector<float>& params, const RolloutOptions& o,
                           Kernels k, TpOptions tpo) {
  std::vector<RankOut> out(tp);
  testing::RunRanks(tp, [&](comm::Collective& c) {
    auto ops = MakeOps(k);
    auto map = MakeTpSliceMap(config, c.rank(), tp);
    ASSERT_TRUE(map.ok()) << map.status();
    std::vector<float> slice(map->slice_floats);
    SliceFromFull(*map, params.data(), slice.data());
    auto dec = TpDecoder::Create(config, &c, ops.get(), nullptr, tpo);
    ASSERT_TRUE(dec.ok()) << dec.status();
    TpDecoder* raw = dec->get();
    ASSERT_EQ(raw->slice_layout().total_floats(), map->slice_floats);
    model::FlatParamProvider pp(raw->slice_layout(), slice.data(), nullptr);
    out[c.rank()].kv_dim = raw->kv_dim();
    RolloutEngine eng(std::move(*dec), ops.get());
    auto res = eng.Generate(Requests(2), o, pp);
    ASSERT_TRUE(res.ok()) << "rank " << c.rank() << ": " << res.status();
    out[c.rank()].result = std::move(*res);
    out[c.rank()].stats = raw->stats();
  });
  return out;
}

void ExpectSameTokens(const RolloutResult& a, const RolloutResult& b, double logprob_tol) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t s = 0; s < a.sequences.size(); ++s) {
    const auto& x = a.sequences[s];
    const auto& y = b.sequences[s];
    EXPECT_EQ(x.tokens, y.tokens) << "sequence " << s;
    ASSERT_EQ(x.raw_logprobs.size(), y.raw_logprobs.size());
    for (size_t j = 0; j < x.raw_logprobs.size(); ++j) {
      EXPECT_NEAR(x.raw_logprobs[j], y.raw_logprobs[j], logprob_tol) << "sequence " << s << " token " << j;
      EXPECT_NEAR(x.logprobs[j], y.logprobs[j], logprob_tol) << "sequence " << s << " token " << j;
    }
  }
}

// Within the fp32 reduction-order tolerance: |log p(TP=2) - log p(TP=1)|.
constexpr double kLogprobTol = 1e-4;

TEST(TpDecoderTest, Tp2GreedyEqualsTp1Reference) {
  for (const char* kind : {"llama", "qwen", "qwen3", "mistral"}) {
    SCOPED_TRACE(kind);
    const ModelConfig config = Config(kind);
    const std::vector<float> params = RandomParams(config, 11);
    const RolloutResult tp1 = RunTp1(config, params, Small(true), Kernels::kReference);
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(overlap ? "overlap" : "unsplit");
      TpOptions tpo;
      tpo.overlap = overlap;
      const auto ranks = RunTp(2, config, params, Small(true), Kernels::kReference, tpo);
      ExpectSameTokens(tp1, ranks[0].result, kLogprobTol);
      // Every rank holds the same bits.
      ExpectSameTokens(ranks[0].result, ranks[1].result, 0.0);
      // The cache holds the rank's kv heads only: Hkv/2 * D.
      EXPECT_EQ(ranks[0].kv_dim, config.KvHeads() / 2 * config.HeadDim());
      EXPECT_EQ(ranks[0].result.kv_pool_bytes * 2, tp1.kv_pool_bytes);
      EXPECT_GT(ranks[0].stats.allreduces, 0);
    }
  }
}

TEST(TpDecoderTest, OverlapGivesTheUnsplitBitsWithReferenceKernels) {
  const ModelConfig config = Config("qwen");
  const std::vector<float> params = RandomParams(config, 5);
  TpOptions unsplit, split;
  split.overlap = true;
  const auto a = RunTp(2, config, params, Small(true), Kernels::kReference, unsplit);
  const auto b = RunTp(2, config, params, Small(true), Kernels::kReference, split);
  ExpectSameTokens(a[0].result, b[0].result, 0.0);
  // One all-reduce per block and half instead of one per block, moving the
  // same bytes.
  EXPECT_GT(b[0].stats.allreduces, a[0].stats.allreduces);
  EXPECT_EQ(a[0].stats.allreduce_bytes, b[0].stats.allreduce_bytes);
  EXPECT_GE(b[0].stats.hidden_share(), 0.0);
  EXPECT_LE(b[0].stats.hidden_share(), 1.0);
  EXPECT_EQ(a[0].stats.hidden_share(), 0.0);
}

TEST(TpDecoderTest, Tp2SamplingEqualsTp1ForTheSameSeeds) {
  for (Kernels k : {Kernels::kReference, Kernels::kCpu}) {
    const ModelConfig config = Config("llama");
    const std::vector<float> params = RandomParams(config, 3);
    const RolloutResult tp1 = RunTp1(config, params, Small(false), k);
    TpOptions tpo;
    tpo.overlap = true;
    const auto ranks = RunTp(2, config, params, Small(false), k, tpo);
    ExpectSameTokens(tp1, ranks[0].result, kLogprobTol);
    ExpectSameTokens(ranks[0].result, ranks[1].result, 0.0);
  }
}

TEST(TpDecoderTest, Tp2GreedyEqualsTp1CpuKernels) {
  const ModelConfig config = Config("qwen3");
  const std::vector<float> params = RandomParams(config, 17);
  const RolloutResult tp1 = RunTp1(config, params, Small(true), Kernels::kCpu);
  for (bool overlap : {false, true}) {
    TpOptions tpo;
    tpo.overlap = overlap;
    const auto ranks = RunTp(2, config, params, Small(true), Kernels::kCpu, tpo);
    ExpectSameTokens(tp1, ranks[0].result, kLogprobTol);
    ExpectSameTokens(ranks[0].result, ranks[1].result, 0.0);
  }
}

TEST(TpDecoderTest, SlicesOfAllRanksCoverTheSplitTensors) {
  const ModelConfig config = Config("qwen");
  const model::ParamLayout full(config);
  for (int tp : {1, 2}) {
    std::vector<int> hits(full.total_floats(), 0);
    for (int r = 0; r < tp; ++r) {
      auto map = MakeTpSliceMap(config, r, tp);
      ASSERT_TRUE(map.ok()) << map.status();
      for (const TpRun& run : map->runs) {
        for (size_t i = 0; i < run.count; ++i) ++hits[run.src + i];
      }
    }
    // Split tensors are covered once over the ranks, replicated ones by
    // every rank.
    for (const auto& t : full.tensors()) {
      const bool split = t.name.find("_proj") != std::string::npos;
      for (size_t i = 0; i < t.numel; ++i) {
        ASSERT_EQ(hits[t.offset + i], split ? 1 : tp) << t.name << " element " << i;
      }
    }
  }
}

TEST(TpDecoderTest, RefusesShapesThatDoNotDivide) {
  auto heads = TpSliceConfig(Config("llama"), 3);
  ASSERT_FALSE(heads.ok());
  EXPECT_EQ(heads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(heads.status().message().find("num_attention_heads (4)"), std::string::npos) << heads.status();
  auto kv = TpSliceConfig(Config("llama"), 4);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("num_key_value_heads (2)"), std::string::npos) << kv.status();
  auto mlp = TpSliceConfig(Config("llama", 41), 2);
  ASSERT_FALSE(mlp.ok());
  EXPECT_NE(mlp.status().message().find("intermediate_size (41)"), std::string::npos) << mlp.status();
  auto zero = TpSliceConfig(Config("llama"), 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("rollout.tp_size 0"), std::string::npos) << zero.status();
  auto rank = MakeTpSliceMap(Config("llama"), 2, 2);
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.status().message().find("rank 2"), std::string::npos) << rank.status();
  auto ok = TpSliceConfig(Config("llama"), 2);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->num_attention_heads, 2);
  EXPECT_EQ(ok->num_key_value_heads, 1);
  EXPECT_EQ(ok->intermediate_size, 20);
  EXPECT_EQ(ok->HeadDim(), 8);
}

TEST(TpDecoderTest, APeerThatAbortsFailsTheForwardWithoutHanging) {
  const ModelConfig config = Config("llama");
  const std::vector<float> params = RandomParams(config, 9);
  for (bool overlap : {false, true}) {
    std::vector<absl::Status> status(2);
    testing::RunRanks(
        2,
        [&](comm::Collective& c) {
          auto ops = kernels::MakeReferenceOps();
          auto map = MakeTpSliceMap(config, c.rank(), 2);
          ASSERT_TRUE(map.ok());
          std::vector<float> slice(map->slice_floats);
          SliceFromFull(*map, params.data(), slice.data());
          TpOptions tpo;
          tpo.overlap = overlap;
          tpo.timeout = std::chrono::milliseconds(5000);
          auto dec = TpDecoder::Create(config, &c, ops.get(), nullptr, tpo);
          ASSERT_TRUE(dec.ok());
          model::FlatParamProvider pp((*dec)->slice_layout(), slice.data(), nullptr);
          if (c.rank() == 1) c.Abort();
          RolloutEngine eng(std::move(*dec), ops.get());
          status[c.rank()] = eng.Generate(Requests(1), Small(true), pp).status();
        },
        testing::TestOptions(std::chrono::milliseconds(5000)));
    EXPECT_FALSE(status[0].ok());
    EXPECT_FALSE(status[1].ok());
    EXPECT_NE(status[1].message().find("allreduce"), std::string::npos) << status[1];
  }
}

}  // namespace
}  // namespace tandem::rollout
