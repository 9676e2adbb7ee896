// Stage 3 with a hierarchical partition (hpZ) and int8 weight gathers (qwZ),
// 4 ranks as threads declared on 2 "nodes":
//  * hpZ trains the tiny model like flat stage 3: after 12 steps every
//    parameter within 2e-5 * max(1, |p|) (fp32 reduction order; measured
//    about 1e-6), every step's loss within 1e-5 relative; inter-node bytes
//    (the tier ledger) below 0.6x of flat stage 3 - both for ranks placed
//    node by node and interleaved;
//  * qwZ (flat and with hpZ, and hpZ + int4 gradients) tracks the fp32 run:
//    final loss within 2% relative; gathers move about 1/4 of the bytes;
//  * with bf16 compute (fp32 masters): hpZ equals flat stage 3 bf16 (every
//    step's loss within 1e-5 relative, parameters within 1e-4; measured
//    1e-6 and 5.2e-6), qwZ and hpZ + qwZ track flat bf16 (final
//    loss within 2%);
//  * checkpoint shards of hpZ are ranges of the full vector (GatherFull) and
//    load back (LoadParamShard + AllgatherParams);
//  * bad options fail with a message naming the key.
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/bf16.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/comm/node_collectives.h"
#include "worker/comm/tiered_collective.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using ::tandem::testing::TestOptions;
using test_model::kPrompt;
using test_model::MakeSequence;
using test_model::TinyConfig;
using test_model::UnitsOf;

constexpr int kSteps = 12;
constexpr int kBatch = 8;  // sequences per step, 2 micro-batches of 4
constexpr float kLr = 3e-3f, kClip = 1.0f;

// ---- training ---------------------------------------------------------------------

struct Setup {
  bool hierarchical = false;
  WeightQuantization weights = WeightQuantization::kNone;
  GradCompression grads = GradCompression::kNone;
  Precision precision = Precision::kFp32;
};

struct RunResult {
  std::vector<double> losses;
  std::vector<float> final_params;
  uint64_t inter_sent = 0;   // every rank, the tier ledger
  uint64_t gather_sent = 0;  // every rank, allgather bytes (all communicators)
};

// fn(rank, flat, groups, ledger) on one thread per entry of `nodes`.
void RunOnNodes(const std::vector<std::string>& nodes,
                const std::function<void(int, comm::Collective&, comm::NodeCollectives&, comm::TierLedger&)>& fn) {
  comm::InMemoryStore store;
  const int n = static_cast<int>(nodes.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto ledger = std::make_shared<comm::TierLedger>();
      auto c = comm::MakeCollective("gloo", store, r, n, TestOptions());
      ASSERT_TRUE(c.ok()) << c.status();
      auto flat = comm::MakeTieredCollective(std::move(*c), nodes, ledger);
      ASSERT_TRUE(flat.ok()) << flat.status();
      auto groups = comm::MakeNodeCollectives("gloo", store, nodes, r, TestOptions(), ledger);
      ASSERT_TRUE(groups.ok()) << groups.status();
      fn(r, **flat, *groups, *ledger);
    });
  }
  for (auto& t : threads) t.join();
}

uint64_t GatherBytes(comm::Collective& c) { return c.bytes(comm::CollectiveKind::kAllgather).sent; }

RunResult Train(const std::vector<std::string>& nodes, const Setup& setup) {
  const model::ModelConfig config = TinyConfig();
  const int n = static_cast<int>(nodes.size());
  std::vector<std::vector<double>> sample_loss(kSteps, std::vector<double>(kBatch));
  std::vector<double> tokens(kSteps, 0);
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < kBatch; ++i) tokens[s] += MakeSequence(s, i, config.vocab_size).size() - kPrompt;
  }
  RunResult out;
  std::mutex mu;
  RunOnNodes(nodes, [&](int rank, comm::Collective& c, comm::NodeCollectives& g, comm::TierLedger& ledger) {
    auto ops = kernels::MakeReferenceOps();
    model::Model m(config, ops.get(), 64);
    ZeroOptions o;
    o.stage = 3;
    o.units = UnitsOf(m.layout());
    o.comm = &c;
    o.ops = ops.get();
    o.adamw = {0.9f, 0.95f, 1e-8f, 0.01f};
    o.hierarchical_partition = setup.hierarchical;
    o.intra = g.intra.get();
    o.inter = g.inter.get();
    o.weight_quantization = setup.weights;
    o.grad_compression = setup.grads;
    o.precision = setup.precision;
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    std::vector<float> init(m.layout().total_floats());
    m.InitParams(42, init.data());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    ledger.Reset();
    for (auto* comm : {&c, g.intra.get(), g.inter.get()}) comm->ResetBytes();
    for (int s = 0; s < kSteps; ++s) {
      z.ZeroGrads();
      for (int mb = 0; mb < 2; ++mb) {
        model::Batch batch;
        std::vector<int> mine;
        std::vector<float> mask;
        for (int i = mb * 4; i < mb * 4 + 4; ++i) {
          if (i % n != rank) continue;
          const auto seq = MakeSequence(s, i, config.vocab_size);
          batch.AddSequence(seq);
          mine.push_back(i);
          for (size_t k = 0; k + 1 < seq.size(); ++k) mask.push_back(k + 1 >= kPrompt ? 1.f : 0.f);
        }
        const int t = batch.num_tokens();
        std::vector<float> logp(t), dlogp(t);
        ASSERT_TRUE(m.ForwardLogprobs(batch, z, logp.data()).ok());
        for (int k = 0; k < t; ++k) dlogp[k] = static_cast<float>(-mask[k] / tokens[s]);
        for (int q = 0; q < batch.num_seqs(); ++q) {
          double sum = 0;
          for (int k = batch.cu_seqlens[q]; k < batch.cu_seqlens[q + 1]; ++k) sum -= mask[k] * double(logp[k]);
          std::lock_guard<std::mutex> lock(mu);
          sample_loss[s][mine[q]] = sum;
        }
        ASSERT_TRUE(m.Backward(dlogp.data(), z).ok());
        ASSERT_TRUE(z.status().ok()) << z.status();
      }
      auto r = z.Step(kLr, kClip);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    ASSERT_TRUE(z.Drain().ok());
    {
      std::lock_guard<std::mutex> lock(mu);
      out.inter_sent += ledger.total(comm::Tier::kInterNode).sent;
      out.gather_sent += GatherBytes(c) + GatherBytes(*g.intra) + GatherBytes(*g.inter);
    }
    std::vector<float> full(z.num_params());
    ASSERT_TRUE(z.GatherFull(full.data()).ok());
    if (rank == 0) out.final_params = std::move(full);
  });
  for (int s = 0; s < kSteps; ++s) {
    double sum = 0;
    for (double l : sample_loss[s]) sum += l;
    out.losses.push_back(sum / tokens[s]);
  }
  return out;
}

double Rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(a), std::fabs(b)); }

const std::vector<std::string> kByNode = {"a", "a", "b", "b"};
const std::vector<std::string> kInterleaved = {"a", "b", "a", "b"};

class Hierarchical : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(Hierarchical, EqualsFlatStage3WithFewerInterNodeBytes) {
  const RunResult flat = Train(GetParam(), {});
  const RunResult hpz = Train(GetParam(), {.hierarchical = true});
  ASSERT_EQ(flat.final_params.size(), hpz.final_params.size());
  ASSERT_FALSE(flat.final_params.empty());
  EXPECT_LT(flat.losses.back(), 0.9 * flat.losses.front()) << "it learns";
  double worst = 0;
  for (size_t i = 0; i < flat.final_params.size(); ++i) {
    const double d = std::fabs(double(flat.final_params[i]) - hpz.final_params[i]) /
                     std::max(1.0, std::fabs(double(flat.final_params[i])));
    worst = std::max(worst, d);
  }
  for (int s = 0; s < kSteps; ++s) EXPECT_LE(Rel(flat.losses[s], hpz.losses[s]), 1e-5) << "step " << s;
  std::printf("[hpz] worst parameter difference %.3g; inter-node bytes sent: flat %llu, hpZ %llu (%.3f)\n", worst,
              static_cast<unsigned long long>(flat.inter_sent), static_cast<unsigned long long>(hpz.inter_sent),
              double(hpz.inter_sent) / double(flat.inter_sent));
  EXPECT_LE(worst, 2e-5);
  EXPECT_GT(flat.inter_sent, 0u);
  EXPECT_LT(double(hpz.inter_sent), 0.6 * double(flat.inter_sent));
}

INSTANTIATE_TEST_SUITE_P(Zero, Hierarchical, ::testing::Values(kByNode, kInterleaved),
                         [](const auto& info) { return info.param == kByNode ? "by_node" : "interleaved"; });

TEST(QuantizedWeights, TrackFp32AndMoveAQuarterOfTheGatherBytes) {
  const RunResult fp32 = Train(kByNode, {});
  const RunResult qw = Train(kByNode, {.weights = WeightQuantization::kInt8});
  const RunResult hpz = Train(kByNode, {.hierarchical = true});
  const RunResult hpz_qw = Train(kByNode, {.hierarchical = true, .weights = WeightQuantization::kInt8});
  const RunResult all =
      Train(kByNode, {.hierarchical = true, .weights = WeightQuantization::kInt8, .grads = GradCompression::kInt4});
  std::printf(
      "[qwz] final loss fp32 %.5f, qwZ %.5f, hpZ+qwZ %.5f, hpZ+qwZ+int4 %.5f; gather bytes fp32 %llu qwZ %llu; "
      "inter-node bytes flat %llu, hpZ %llu, hpZ+qwZ %llu, hpZ+qwZ+int4 %llu\n",
      fp32.losses.back(), qw.losses.back(), hpz_qw.losses.back(), all.losses.back(),
      static_cast<unsigned long long>(fp32.gather_sent), static_cast<unsigned long long>(qw.gather_sent),
      static_cast<unsigned long long>(fp32.inter_sent), static_cast<unsigned long long>(hpz.inter_sent),
      static_cast<unsigned long long>(hpz_qw.inter_sent), static_cast<unsigned long long>(all.inter_sent));
  for (const RunResult* r : {&qw, &hpz_qw, &all}) {
    EXPECT_LE(Rel(r->losses.back(), fp32.losses.back()), 0.02);
  }
  EXPECT_LT(double(qw.gather_sent), 0.3 * double(fp32.gather_sent));
  EXPECT_LT(hpz_qw.inter_sent, hpz.inter_sent);
  EXPECT_LT(all.inter_sent, hpz_qw.inter_sent);
  EXPECT_LT(4.0 * double(all.inter_sent), double(fp32.inter_sent)) << "all techniques: at least 4x fewer";
}

// bf16 compute copy, fp32 masters: hpZ's secondary copy holds the bf16
// pieces, so the gathers serve the bits flat stage 3 bf16 computes with;
// only the gradient sums run in another order. The bounds leave room for a
// master that lands on the other side of a bf16 rounding boundary.
TEST(HierarchicalBf16, EqualsFlatStage3Bf16) {
  for (const auto& nodes : {kByNode, kInterleaved}) {
    const RunResult flat = Train(nodes, {.precision = Precision::kBf16});
    const RunResult hpz = Train(nodes, {.hierarchical = true, .precision = Precision::kBf16});
    ASSERT_EQ(flat.final_params.size(), hpz.final_params.size());
    ASSERT_FALSE(flat.final_params.empty());
    EXPECT_LT(flat.losses.back(), 0.9 * flat.losses.front()) << "it learns";
    double worst = 0, worst_loss = 0;
    for (size_t i = 0; i < flat.final_params.size(); ++i) {
      const double d = std::fabs(double(flat.final_params[i]) - hpz.final_params[i]) /
                       std::max(1.0, std::fabs(double(flat.final_params[i])));
      worst = std::max(worst, d);
    }
    for (int s = 0; s < kSteps; ++s) worst_loss = std::max(worst_loss, Rel(flat.losses[s], hpz.losses[s]));
    std::printf(
        "[hpz bf16] worst parameter difference %.3g, worst loss difference %.3g; inter-node bytes sent: "
        "flat %llu, hpZ %llu (%.3f)\n",
        worst, worst_loss, static_cast<unsigned long long>(flat.inter_sent),
        static_cast<unsigned long long>(hpz.inter_sent), double(hpz.inter_sent) / double(flat.inter_sent));
    EXPECT_LE(worst_loss, 1e-5);
    EXPECT_LE(worst, 1e-4);
    EXPECT_LT(double(hpz.inter_sent), 0.6 * double(flat.inter_sent));
  }
}

TEST(QuantizedWeightsBf16, TrackFlatBf16) {
  const RunResult flat = Train(kByNode, {.precision = Precision::kBf16});
  const RunResult qw = Train(kByNode, {.weights = WeightQuantization::kInt8, .precision = Precision::kBf16});
  const RunResult hpz_qw =
      Train(kByNode, {.hierarchical = true, .weights = WeightQuantization::kInt8, .precision = Precision::kBf16});
  std::printf("[qwz bf16] final loss flat bf16 %.5f, qwZ %.5f, hpZ+qwZ %.5f; gather bytes flat %llu, qwZ %llu\n",
              flat.losses.back(), qw.losses.back(), hpz_qw.losses.back(),
              static_cast<unsigned long long>(flat.gather_sent), static_cast<unsigned long long>(qw.gather_sent));
  EXPECT_LE(Rel(qw.losses.back(), flat.losses.back()), 0.02);
  EXPECT_LE(Rel(hpz_qw.losses.back(), flat.losses.back()), 0.02);
  // int8 is about half of the bf16 bytes.
  EXPECT_LT(double(qw.gather_sent), 0.65 * double(flat.gather_sent));
  EXPECT_LT(hpz_qw.inter_sent, flat.inter_sent);
}

// ---- checkpoint shards -----------------------------------------------------------

TEST(HierarchicalShards, ShardsAreRangesOfTheFullVectorAndLoadBack) {
  const std::vector<Unit> units = {{0, 7}, {7, 130}, {137, 1}, {138, 65}};
  const size_t psi = 203;
  std::vector<float> full(psi), other(psi);
  for (size_t i = 0; i < psi; ++i) {
    full[i] = 0.01f * static_cast<float>(i) - 1.f;
    other[i] = 0.5f - 0.003f * static_cast<float>(i);
  }
  for (int variant = 0; variant < 4; ++variant) {
    const bool quantized = variant % 2 == 1, half = variant >= 2;
    RunOnNodes(kInterleaved, [&](int, comm::Collective& c, comm::NodeCollectives& g, comm::TierLedger&) {
      auto ops = kernels::MakeReferenceOps();
      ZeroOptions o;
      o.stage = 3;
      o.units = units;
      o.comm = &c;
      o.ops = ops.get();
      o.hierarchical_partition = true;
      o.intra = g.intra.get();
      o.inter = g.inter.get();
      if (quantized) o.weight_quantization = WeightQuantization::kInt8;
      if (half) o.precision = Precision::kBf16;
      auto z = ZeroOptimizer::Create(o);
      ASSERT_TRUE(z.ok()) << z.status();
      ASSERT_TRUE((*z)->InitFromFull(full.data()).ok());
      std::vector<float> shard((*z)->shard_size());
      (*z)->CopyParamShard(shard.data());
      for (const auto& p : (*z)->shard_map()) {
        for (size_t i = 0; i < p.size; ++i) {
          ASSERT_EQ(shard[p.shard_offset + i], full[units[p.unit].offset + p.unit_offset + i]);
        }
      }
      // Load another vector's shard; the gathers then serve it.
      for (const auto& p : (*z)->shard_map()) {
        std::copy_n(other.data() + units[p.unit].offset + p.unit_offset, p.size, shard.data() + p.shard_offset);
      }
      (*z)->LoadParamShard(shard.data());
      ASSERT_TRUE((*z)->AllgatherParams().ok());
      std::vector<float> back(psi);
      ASSERT_TRUE((*z)->GatherFull(back.data()).ok());
      EXPECT_EQ(back, other);
      for (int u = 0; u < 4; ++u) {
        const float* w = (*z)->AcquireParams(u);
        ASSERT_NE(w, nullptr) << (*z)->status();
        for (size_t i = 0; i < units[u].size; ++i) {
          const float want = other[units[u].offset + i];
          // int8 (stochastic rounding): within one step of the block's
          // largest value (< 1.3); bf16: one more rounding of 2^-9 relative.
          const float bound = (quantized ? 1.3f / 127 : 0.f) + (half ? std::fabs(want) / 256 : 0.f);
          EXPECT_NEAR(w[i], want, bound) << "unit " << u << " i " << i;
          if (half && !quantized) EXPECT_EQ(w[i], kernels::FloatFromBf16(kernels::Bf16FromFloat(want)));
        }
        (*z)->ReleaseParams(u);
      }
      // Rollouts see bf16(masters) (fp32: the masters), quantised or not.
      ASSERT_TRUE((*z)->BeginInference().ok());
      for (int u = 0; u < 4; ++u) {
        const float* w = (*z)->inference_view().AcquireParams(u);
        ASSERT_NE(w, nullptr);
        for (size_t i = 0; i < units[u].size; ++i) {
          const float want = other[units[u].offset + i];
          EXPECT_EQ(w[i], half ? kernels::FloatFromBf16(kernels::Bf16FromFloat(want)) : want)
              << "unit " << u << " i " << i;
        }
        (*z)->inference_view().ReleaseParams(u);
      }
      (*z)->EndInference();
    });
  }
}

// ---- bad options -------------------------------------------------------------------

TEST(HierarchicalShards, BadOptionsSayWhatIsWrong) {
  ::tandem::testing::RunRanks(2, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    ZeroOptions o;
    o.units = {{0, 10}};
    o.comm = &c;
    o.ops = ops.get();
    o.stage = 2;
    o.hierarchical_partition = true;
    o.intra = &c;
    o.inter = &c;
    auto z = ZeroOptimizer::Create(o);
    ASSERT_FALSE(z.ok());
    EXPECT_TRUE(absl::StrContains(z.status().message(), "zero.hierarchical_partition needs ZeRO stage 3"))
        << z.status();
    o.stage = 3;
    z = ZeroOptimizer::Create(o);  // 2 x 2 is not a world of 2
    ASSERT_FALSE(z.ok());
    EXPECT_TRUE(absl::StrContains(z.status().message(), "same number of workers")) << z.status();
    o.intra = nullptr;
    z = ZeroOptimizer::Create(o);
    ASSERT_FALSE(z.ok());
    EXPECT_TRUE(absl::StrContains(z.status().message(), "intra- and inter-node")) << z.status();
    o.hierarchical_partition = false;
    o.stage = 1;
    o.weight_quantization = WeightQuantization::kInt8;
    z = ZeroOptimizer::Create(o);
    ASSERT_FALSE(z.ok());
    EXPECT_TRUE(absl::StrContains(z.status().message(), "zero.weight_quantization int8 needs ZeRO stage 3"))
        << z.status();
    // int8 gathers with bf16 compute: accepted.
    o.stage = 3;
    o.precision = Precision::kBf16;
    z = ZeroOptimizer::Create(o);
    EXPECT_TRUE(z.ok()) << z.status();
  });
  EXPECT_FALSE(ParseWeightQuantization("int4").ok());
  EXPECT_TRUE(absl::StrContains(ParseWeightQuantization("int4").status().message(), "expected none or int8"));
  EXPECT_EQ(*ParseWeightQuantization(""), WeightQuantization::kNone);
  EXPECT_EQ(*ParseWeightQuantization("int8"), WeightQuantization::kInt8);
}

}  // namespace
}  // namespace tandem::zero
