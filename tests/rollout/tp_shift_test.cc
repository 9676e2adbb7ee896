// Shift parallelism (tp_decoder.h, tp_decoder_shift.cc): ranks as threads
// over Gloo on 127.0.0.1. With a threshold that sends the prefill steps
// sequence-parallel and the decode steps tensor-parallel, and with a
// threshold of 1 (every step sequence-parallel, including steps with fewer
// rows than ranks), greedy tokens equal TP=1 and TP=2 and the log-probs
// agree within the TP tests' fp32 tolerance; sampled tokens equal TP=1 for
// the same seeds; every rank gets the same bits; the KV cache keeps the TP
// layout (a sequence prefilled sequence-parallel decodes tensor-parallel);
// the mode counters add up; a sequence-parallel step without the full
// parameters and a threshold below 1 are refused; a peer that aborts fails
// a sequence-parallel step without a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/rollout/tp_test_util.h"
#include "tests/support/run_ranks.h"
#include "worker/rollout/tp_decoder.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::rollout {
namespace {

using namespace tptest;  // NOLINT(build/namespaces): the shared helpers

struct RankOut {
  RolloutResult result;
  TpStats stats;
  size_t scratch_bytes = 0;
};

// Every rank of a TP=2 group runs the engine over its slice and, for
// sequence-parallel steps, the full parameters.
std::vector<RankOut> RunShift(const ModelConfig& config, const std::vector<float>& params, const RolloutOptions& o,
                              Kernels k, TpOptions tpo) {
  std::vector<RankOut> out(2);
  testing::RunRanks(2, [&](comm::Collective& c) {
    auto ops = MakeOps(k);
    auto map = MakeTpSliceMap(config, c.rank(), 2);
    ASSERT_TRUE(map.ok()) << map.status();
    std::vector<float> slice(map->slice_floats);
    SliceFromFull(*map, params.data(), slice.data());
    std::vector<float> full = params;
    auto dec = TpDecoder::Create(config, &c, ops.get(), nullptr, tpo);
    ASSERT_TRUE(dec.ok()) << dec.status();
    TpDecoder* raw = dec->get();
    ASSERT_EQ(raw->full_layout().total_floats(), full.size());
    model::FlatParamProvider pp(raw->slice_layout(), slice.data(), nullptr);
    model::FlatParamProvider fp(raw->full_layout(), full.data(), nullptr);
    raw->SetFullParams(&fp);
    RolloutEngine eng(std::move(*dec), ops.get());
    auto res = eng.Generate(Requests(2), o, pp);
    ASSERT_TRUE(res.ok()) << "rank " << c.rank() << ": " << res.status();
    out[c.rank()].result = std::move(*res);
    out[c.rank()].stats = raw->stats();
    out[c.rank()].scratch_bytes = raw->scratch_bytes();
  });
  return out;
}

// Room for every prompt in the first step (18 prompt rows: the four
// prompts of Requests, shared by their groups), decode steps of at most 8
// rows.
RolloutOptions Wide(bool greedy) {
  RolloutOptions o = Small(greedy);
  o.max_batch_tokens = 64;
  return o;
}

constexpr double kLogprobTol = 1e-4;
constexpr int kPrefillOnly = 9;  // > the 8 decode rows, <= the prefill step

TpOptions Shift(int threshold, bool overlap = false) {
  TpOptions tpo;
  tpo.shift = true;
  tpo.shift_threshold_tokens = threshold;
  tpo.overlap = overlap;
  return tpo;
}

void ExpectCounters(const TpStats& s) {
  EXPECT_EQ(s.tp_steps + s.sp_steps, s.forwards);
  EXPECT_GT(s.tp_rows + s.sp_rows, 0);
}

TEST(TpShiftTest, GreedyEqualsTp1AndTp2InEveryMode) {
  for (const char* kind : {"llama", "qwen", "qwen3", "mistral", "linear"}) {
    SCOPED_TRACE(kind);
    const ModelConfig config = Config(kind);
    const std::vector<float> params = RandomParams(config, 11);
    for (const RolloutOptions& o : {Wide(true), Small(true)}) {
      SCOPED_TRACE(o.max_batch_tokens);
      const RolloutResult tp1 = RunTp1(config, params, o, Kernels::kReference);
      const auto tp2 = RunShift(config, params, o, Kernels::kReference, TpOptions{});
      ExpectSameTokens(tp1, tp2[0].result, kLogprobTol);
      // Wide: the prompts' step sequence-parallel, decode steps
      // tensor-parallel. Small (7-row steps): steps of 4 rows and more,
      // prefill chunks and decode rows mixed, sequence-parallel.
      const int some = o.max_batch_tokens == 64 ? kPrefillOnly : 4;
      for (int threshold : {some, 1}) {
        SCOPED_TRACE(threshold);
        const auto sp = RunShift(config, params, o, Kernels::kReference, Shift(threshold, threshold != 1));
        ExpectSameTokens(tp1, sp[0].result, kLogprobTol);
        ExpectSameTokens(tp2[0].result, sp[0].result, kLogprobTol);
        ExpectSameTokens(sp[0].result, sp[1].result, 0.0);
        EXPECT_EQ(sp[0].result.kv_pool_bytes * 2, tp1.kv_pool_bytes);
        ExpectCounters(sp[0].stats);
        EXPECT_GT(sp[0].stats.sp_steps, 0);
        EXPECT_GT(sp[0].stats.sp_collectives, 0);
        if (threshold == 1) {
          EXPECT_EQ(sp[0].stats.tp_steps, 0);
          EXPECT_EQ(sp[0].stats.allreduces, 0);
        } else if (o.max_batch_tokens == 64) {
          // The prompts' step ran sequence-parallel, every decode step
          // tensor-parallel over the same cache.
          EXPECT_EQ(sp[0].stats.sp_steps, 1);
          EXPECT_EQ(sp[0].stats.sp_rows, 18);
          EXPECT_GT(sp[0].stats.tp_steps, 0);
        }
      }
    }
  }
}

TEST(TpShiftTest, GreedyEqualsTp1CpuKernels) {
  const ModelConfig config = Config("qwen3");
  const std::vector<float> params = RandomParams(config, 17);
  const RolloutResult tp1 = RunTp1(config, params, Wide(true), Kernels::kCpu);
  for (int threshold : {kPrefillOnly, 1}) {
    const auto sp = RunShift(config, params, Wide(true), Kernels::kCpu, Shift(threshold, true));
    ExpectSameTokens(tp1, sp[0].result, kLogprobTol);
    ExpectSameTokens(sp[0].result, sp[1].result, 0.0);
  }
}

TEST(TpShiftTest, SamplingEqualsTp1ForTheSameSeeds) {
  for (Kernels k : {Kernels::kReference, Kernels::kCpu}) {
    for (const char* kind : {"llama", "qwen"}) {
      SCOPED_TRACE(kind);
      const ModelConfig config = Config(kind);
      const std::vector<float> params = RandomParams(config, 3);
      const RolloutResult tp1 = RunTp1(config, params, Wide(false), k);
      for (int threshold : {kPrefillOnly, 1}) {
        const auto sp = RunShift(config, params, Wide(false), k, Shift(threshold));
        ExpectSameTokens(tp1, sp[0].result, kLogprobTol);
        ExpectSameTokens(sp[0].result, sp[1].result, 0.0);
      }
    }
  }
}

TEST(TpShiftTest, AThresholdAboveEveryStepRunsTensorParallel) {
  const ModelConfig config = Config("llama");
  const std::vector<float> params = RandomParams(config, 5);
  const auto tp2 = RunShift(config, params, Wide(true), Kernels::kReference, TpOptions{});
  const auto sp = RunShift(config, params, Wide(true), Kernels::kReference, Shift(1 << 20));
  ExpectSameTokens(tp2[0].result, sp[0].result, 0.0);
  EXPECT_EQ(sp[0].stats.sp_steps, 0);
  EXPECT_EQ(sp[0].stats.sp_collectives, 0);
  EXPECT_EQ(sp[0].stats.tp_steps, sp[0].stats.forwards);
  // The sequence-parallel scratch is held only when shift is on.
  EXPECT_GT(sp[0].scratch_bytes, tp2[0].scratch_bytes);
}

TEST(TpShiftTest, RefusesABadThresholdAndMissingFullParameters) {
  const ModelConfig config = Config("llama");
  auto ops = kernels::MakeReferenceOps();
  auto bad = TpDecoder::Create(config, nullptr, ops.get(), nullptr, Shift(0));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("rollout.shift_threshold_tokens 0 must be >= 1"), std::string::npos)
      << bad.status();

  const std::vector<float> params = RandomParams(config, 9);
  std::vector<absl::Status> status(2);
  testing::RunRanks(2, [&](comm::Collective& c) {
    auto rops = kernels::MakeReferenceOps();
    auto map = MakeTpSliceMap(config, c.rank(), 2);
    ASSERT_TRUE(map.ok());
    std::vector<float> slice(map->slice_floats);
    SliceFromFull(*map, params.data(), slice.data());
    auto dec = TpDecoder::Create(config, &c, rops.get(), nullptr, Shift(1));
    ASSERT_TRUE(dec.ok());
    model::FlatParamProvider pp((*dec)->slice_layout(), slice.data(), nullptr);
    RolloutEngine eng(std::move(*dec), rops.get());
    status[c.rank()] = eng.Generate(Requests(1), Small(true), pp).status();
  });
  for (const absl::Status& st : status) {
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("full model's parameters"), std::string::npos) << st;
  }
}

TEST(TpShiftTest, APeerThatAbortsFailsASequenceParallelStepWithoutHanging) {
  const ModelConfig config = Config("llama");
  const std::vector<float> params = RandomParams(config, 9);
  std::vector<absl::Status> status(2);
  testing::RunRanks(
      2,
      [&](comm::Collective& c) {
        auto ops = kernels::MakeReferenceOps();
        auto map = MakeTpSliceMap(config, c.rank(), 2);
        ASSERT_TRUE(map.ok());
        std::vector<float> slice(map->slice_floats);
        SliceFromFull(*map, params.data(), slice.data());
        std::vector<float> full = params;
        TpOptions tpo = Shift(1);
        tpo.timeout = std::chrono::milliseconds(5000);
        auto dec = TpDecoder::Create(config, &c, ops.get(), nullptr, tpo);
        ASSERT_TRUE(dec.ok());
        model::FlatParamProvider pp((*dec)->slice_layout(), slice.data(), nullptr);
        model::FlatParamProvider fp((*dec)->full_layout(), full.data(), nullptr);
        (*dec)->SetFullParams(&fp);
        if (c.rank() == 1) c.Abort();
        RolloutEngine eng(std::move(*dec), ops.get());
        status[c.rank()] = eng.Generate(Requests(1), Small(true), pp).status();
      },
      testing::TestOptions(std::chrono::milliseconds(5000)));
  EXPECT_FALSE(status[0].ok());
  EXPECT_FALSE(status[1].ok());
  EXPECT_NE(status[1].message().find("all_to_all"), std::string::npos) << status[1];
}

// Sparse attention in sequence-parallel steps: each rank attends over its
// heads of every row, choosing blocks per head as at TP 1. Threshold 1:
// every step sequence-parallel; 9: only the prompts' step.
TEST(TpShiftTest, SparseAttentionEqualsTp1) {
  const ModelConfig config = Config("llama");
  const std::vector<float> params = RandomParams(config, 13);
  RolloutOptions o = Wide(true);
  o.max_new_tokens = 30;
  o.sparse = kernels::SparseDecodeParams{4, 1, 1, 1};
  const RolloutResult tp1 = RunTp1(config, params, o, Kernels::kReference);
  for (int threshold : {1, kPrefillOnly}) {
    SCOPED_TRACE(threshold);
    const auto tp2 = RunShift(config, params, o, Kernels::kReference, Shift(threshold));
    ExpectSameTokens(tp1, tp2[0].result, kLogprobTol);
    ExpectSameTokens(tp1, tp2[1].result, kLogprobTol);
    EXPECT_GT(tp2[0].stats.sp_steps, 0);
    EXPECT_EQ(tp2[0].stats.tp_steps > 0, threshold > 1);
  }
}

}  // namespace
}  // namespace tandem::rollout
