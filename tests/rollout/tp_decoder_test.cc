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
#include "tests/rollout/tp_test_util.h"
#include "tests/support/run_ranks.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/tp_decoder.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::rollout {
namespace {

using namespace tptest;  // NOLINT(build/namespaces): the shared helpers

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

TEST(TpDecoderTest, Tp2GreedyEqualsTp1Reference) {
  for (const char* kind : {"llama", "qwen", "qwen3", "mistral", "linear"}) {
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
  for (const char* kind : {"qwen3", "linear"}) {
    SCOPED_TRACE(kind);
    const ModelConfig config = Config(kind);
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
}

// Linear layers split by heads: each rank keeps the recurrent state of its
// heads only (half the states of TP=1), with the decay of the model's head
// index; sampled tokens equal TP=1 for the same seeds, with the halves of
// the overlapped path cutting prefill runs.
TEST(TpDecoderTest, LinearLayersKeepTheirHeadsStatesAndSampleAsTp1) {
  const ModelConfig config = Config("linear");
  const std::vector<float> params = RandomParams(config, 23);
  for (Kernels k : {Kernels::kReference, Kernels::kCpu}) {
    const RolloutResult tp1 = RunTp1(config, params, Small(false), k);
    TpOptions tpo;
    tpo.overlap = true;
    const auto ranks = RunTp(2, config, params, Small(false), k, tpo);
    ExpectSameTokens(tp1, ranks[0].result, kLogprobTol);
    ExpectSameTokens(ranks[0].result, ranks[1].result, 0.0);
    ASSERT_GT(tp1.state_bytes, 0u);
    EXPECT_EQ(ranks[0].result.state_bytes * 2, tp1.state_bytes);
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

// Sparse attention under TP: each rank chooses the blocks of its own
// heads, so TP=2 (unsplit and overlapped) generates TP=1's sparse tokens;
// long enough for 1 chosen block of 4 out of up to 10. (Shift parallelism:
// tp_shift_test.)
TEST(TpDecoderTest, SparseAttentionEqualsTp1) {
  for (const char* kind : {"llama", "qwen3"}) {
    SCOPED_TRACE(kind);
    const ModelConfig config = Config(kind);
    const std::vector<float> params = RandomParams(config, 13);
    RolloutOptions o = Small(true);
    o.max_new_tokens = 30;
    o.sparse = kernels::SparseDecodeParams{4, 1, 1, 1};
    const RolloutResult tp1 = RunTp1(config, params, o, Kernels::kReference);
    RolloutOptions dense = o;
    dense.sparse.reset();
    const RolloutResult tp1_dense = RunTp1(config, params, dense, Kernels::kReference);
    EXPECT_NE(tp1.sequences[0].raw_logprobs, tp1_dense.sequences[0].raw_logprobs);  // sparse is on
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(overlap ? "overlap" : "unsplit");
      TpOptions tpo;
      tpo.overlap = overlap;
      const auto ranks = RunTp(2, config, params, o, Kernels::kReference, tpo);
      ExpectSameTokens(tp1, ranks[0].result, kLogprobTol);
      ExpectSameTokens(tp1, ranks[1].result, kLogprobTol);
    }
  }
}

}  // namespace
}  // namespace tandem::rollout
