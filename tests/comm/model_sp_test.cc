// The model under sequence parallelism (worker/model/sequence_parallel.h,
// sp_attention.h): a hybrid model (full, window:7, linear and full layers)
// and a packed batch of three sequences split over 2 and 3 ranks (threads
// over one store; slices begin and end inside sequences). The log-probs of
// every row and every parameter gradient (summed over the ranks) equal the
// single-rank model's within a relative error of 5e-5 (max abs error / max
// abs value, per tensor). Bad input: slices without a group or of another
// rank, too few rows to split. The split is the even one and the one
// balanced by the model's estimated cost (BalancedSliceBounds).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <vector>

#include "common/base/check.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "tests/comm/comm_test_util.h"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/model/sp_attention.h"

namespace tandem::model {
namespace {

using comm::testing::RunRanks;
constexpr comm::Timeout kT{20000};
constexpr double kTol = 5e-5;

ModelConfig HybridConfig() {
  nlohmann::json j{{"model_type", "llama"},
                   {"vocab_size", 64},
                   {"hidden_size", 32},
                   {"intermediate_size", 48},
                   {"num_hidden_layers", 4},
                   {"num_attention_heads", 4},
                   {"num_key_value_heads", 4},
                   {"rms_norm_eps", 1e-5},
                   {"max_position_embeddings", 4096},
                   {"tandem_layer_types", {"full", "window:7", "linear", "full"}}};
  auto c = ParseConfigJson(j.dump());
  TANDEM_CHECK(c.ok());
  return *c;
}

Batch HybridBatch() {
  Batch b;
  uint32_t x = 12345;
  for (int len : {41, 6, 70}) {
    std::vector<int32_t> seq(len);
    for (int32_t& t : seq) {
      x = x * 1664525u + 1013904223u;
      t = static_cast<int32_t>((x >> 8) % 64);
    }
    b.AddSequence(seq);
  }
  return b;
}

// Weights of the loss per row (a masked mean: dlogp = -mask / sum(mask)).
std::vector<float> Dlogp(int T) {
  std::vector<float> logp(T), mask(T), d(T);
  for (int t = 0; t < T; ++t) mask[t] = (t % 5 == 0) ? 0.f : 1.f;
  SftLoss(logp, mask, d.data());
  return d;
}

double Rel(const float* got, const float* want, size_t n) {
  double e = 0, m = 0;
  for (size_t i = 0; i < n; ++i) {
    e = std::max(e, std::fabs(double(got[i]) - want[i]));
    m = std::max(m, std::fabs(double(want[i])));
  }
  return m > 0 ? e / m : e;
}

// (ranks, balanced): the even split and the split by the model's cost.
class ModelSpTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ModelSpTest, LogprobsAndGradientsEqualSingleRank) {
  const auto [n, balanced] = GetParam();
  const ModelConfig config = HybridConfig();
  const SliceCost cost = balanced ? SliceCostOf(config) : SliceCost{};
  const Batch batch = HybridBatch();
  const int T = batch.num_tokens();
  // The model's cost moves the bounds (later rows see more keys).
  if (balanced) EXPECT_NE(BalancedSliceBounds(batch.cu_seqlens, n, cost), SliceBounds(T, n));
  const std::vector<float> dlogp = Dlogp(T);

  auto ops = kernels::MakeCpuOps(1);
  Model ref(config, ops.get());
  std::vector<float> params(ref.layout().total_floats()), grads(params.size(), 0.f), logp(T);
  ref.InitParams(7, params.data());
  {
    FlatParamProvider pp(ref.layout(), params.data(), grads.data());
    ASSERT_TRUE(ref.ForwardLogprobs(batch, pp, logp.data()).ok());
    ASSERT_TRUE(ref.Backward(dlogp.data(), pp).ok());
  }

  std::vector<float> sp_logp(T, NAN);
  std::vector<std::vector<float>> sp_grads(n, std::vector<float>(params.size(), 0.f));
  RunRanks(n, [&](comm::Collective& c) {
    auto rank_ops = kernels::MakeCpuOps(1);
    Model m(config, rank_ops.get());
    CollectiveSequenceAttention sp(&c, rank_ops.get(), kT);
    m.SetSequenceAttention(&sp);
    auto local = SliceBatch(batch, c.rank(), n, cost);
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ(local->slice->bounds, BalancedSliceBounds(batch.cu_seqlens, n, cost));
    const int off = local->slice->offset;
    FlatParamProvider pp(m.layout(), params.data(), sp_grads[c.rank()].data());
    const absl::Status f = m.ForwardLogprobs(*local, pp, sp_logp.data() + off);
    ASSERT_TRUE(f.ok()) << f;
    const absl::Status b = m.Backward(dlogp.data() + off, pp);
    ASSERT_TRUE(b.ok()) << b;
  });
  std::vector<float> sum(params.size(), 0.f);
  for (const auto& g : sp_grads)
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];

  const double lp = Rel(sp_logp.data(), logp.data(), T);
  EXPECT_LT(lp, kTol);
  double worst = 0;
  for (const TensorView& t : ref.layout().tensors()) {
    const double e = Rel(sum.data() + t.offset, grads.data() + t.offset, t.numel);
    EXPECT_LT(e, kTol) << t.name;
    worst = std::max(worst, e);
  }
  std::printf("[model sp] ranks %d (%s split), %d rows: logp rel err %.1e, worst parameter-gradient rel err %.1e\n", n,
              balanced ? "balanced" : "even", T, lp, worst);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ModelSpTest, ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

// The cost-balanced bounds: without a per-key cost the even split; with
// one, the ranks of a long causal sequence hold fewer rows the later they
// are, and every rank's cost is within one row's of the mean; every rank
// holds a row even when the cost is lopsided.
TEST(SliceBoundsTest, BalanceTheEstimatedCost) {
  const std::vector<int32_t> one{0, 4096};
  EXPECT_EQ(BalancedSliceBounds(one, 3, SliceCost{}), SliceBounds(4096, 3));
  SliceCost full;
  full.per_row = 100;
  full.per_key = 1;
  full.softmax.assign(2, LayerType{});
  for (const std::vector<int32_t>& cu : {one, std::vector<int32_t>{0, 3000, 3001, 3900, 4096}}) {
    for (int n : {2, 3, 4}) {
      const std::vector<int> b = BalancedSliceBounds(cu, n, full);
      ASSERT_EQ(b.size(), size_t(n) + 1);
      EXPECT_EQ(b.front(), 0);
      EXPECT_EQ(b.back(), cu.back());
      std::vector<double> cost(n, 0.0);
      double total = 0, heaviest = 0;
      for (size_t s = 0; s + 1 < cu.size(); ++s) {
        for (int g = cu[s]; g < cu[s + 1]; ++g) {
          const int r = static_cast<int>(std::upper_bound(b.begin(), b.end(), g) - b.begin()) - 1;
          cost[r] += full.Row(g - cu[s]);
          total += full.Row(g - cu[s]);
          heaviest = std::max(heaviest, full.Row(g - cu[s]));
        }
      }
      for (int r = 0; r < n; ++r) EXPECT_NEAR(cost[r], total / n, heaviest) << "rank " << r << " of " << n;
      if (cu == one) {
        for (int r = 0; r + 1 < n; ++r) EXPECT_GT(b[r + 1] - b[r], b[r + 2] - b[r + 1]);
      }
    }
  }
  // A window bounds a row's keys: a window layer alone splits nearly evenly
  // past the window.
  SliceCost window = full;
  window.softmax.assign(2, LayerType{LayerKind::kWindow, 16, 0});
  const std::vector<int> w = BalancedSliceBounds(one, 2, window);
  EXPECT_NEAR(w[1], 2048, 16);
  // As many rows as ranks: one each.
  EXPECT_EQ(BalancedSliceBounds({0, 3}, 3, full), (std::vector<int>{0, 1, 2, 3}));
}

// A model's cost: the per-key part counts its softmax layers only.
TEST(SliceBoundsTest, CostOfAModel) {
  const ModelConfig config = HybridConfig();
  const SliceCost c = SliceCostOf(config);
  EXPECT_GT(c.per_row, 0);
  EXPECT_GT(c.per_key, 0);
  int softmax = 0;
  for (int l = 0; l < config.num_hidden_layers; ++l) softmax += LayerTypeOf(config, l).softmax() ? 1 : 0;
  EXPECT_EQ(static_cast<int>(c.softmax.size()), softmax);
  EXPECT_LT(c.softmax.size(), static_cast<size_t>(config.num_hidden_layers));  // the linear layer
}

TEST(ModelSpTest, RefusesMismatchedBatches) {
  const ModelConfig config = HybridConfig();
  const Batch batch = HybridBatch();
  auto ops = kernels::MakeCpuOps(1);
  std::vector<float> params(Model(config, ops.get()).layout().total_floats()), logp(batch.num_tokens());
  auto small = SliceBatch(batch, 0, batch.num_tokens() + 1);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("cannot be split"), std::string::npos) << small.status();
  EXPECT_EQ(SliceBatch(batch, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
  {  // A slice given to a model without a group.
    Model m(config, ops.get());
    FlatParamProvider pp(m.layout(), params.data(), nullptr);
    auto local = SliceBatch(batch, 0, 2);
    ASSERT_TRUE(local.ok());
    const absl::Status st = m.ForwardLogprobs(*local, pp, logp.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("no sequence-parallel group"), std::string::npos) << st;
  }
  RunRanks(2, [&](comm::Collective& c) {
    auto rank_ops = kernels::MakeCpuOps(1);
    Model m(config, rank_ops.get());
    CollectiveSequenceAttention sp(&c, rank_ops.get(), kT);
    m.SetSequenceAttention(&sp);
    FlatParamProvider pp(m.layout(), params.data(), nullptr);
    std::vector<float> out(batch.num_tokens());
    // A whole batch runs on this rank alone.
    EXPECT_TRUE(m.ForwardLogprobs(batch, pp, out.data()).ok());
    auto other = SliceBatch(batch, 1 - c.rank(), 2);  // the other rank's slice
    ASSERT_TRUE(other.ok());
    const absl::Status st = m.ForwardLogprobs(*other, pp, out.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  });
}

}  // namespace
}  // namespace tandem::model
