// ZeRO mixed precision (ZeroOptions.precision = kBf16): fp32 masters
// partitioned by rank, bf16 compute copy widened per unit for the model.
//  * SFT-like training of a tiny Llama model (worker/model) for 20 steps with
//    N = 1, 2 ranks (threads over Gloo on 127.0.0.1) and stages 0-3: every
//    run's per-step loss matches N = 1 stage 0 bf16 within 1e-5 relative and
//    the fp32 run within a bf16 tolerance (2e-2 relative).
//  * What the model reads is bf16(master) (round to nearest even), the same
//    bits on every rank, after init, steps and a checkpoint reload (also
//    across stages); inference serves the same weights.
//  * Stage 3 allgathers move half the bytes of fp32.
//  * Per-rank memory matches the bf16 formulas of zero_optimizer.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/bf16.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/comm/collective.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using ::tandem::testing::RunRanks;
using test_model::kPrompt;
using test_model::MakeSequence;
using test_model::TinyConfig;
using test_model::UnitsOf;

constexpr int kSteps = 20;
constexpr int kBatch = 4;  // sequences per step, 2 micro-batches of 2
constexpr float kLr = 3e-3f, kClip = 1.0f;

struct RunResult {
  std::vector<double> losses;  // per step, mean over completion tokens
  std::vector<float> final_masters;
};

// One SFT run; the loss of sample i at step s is summed in sample order, so
// the figures do not depend on N apart from the weights themselves.
RunResult Train(Precision precision, int stage, int n) {
  const model::ModelConfig config = TinyConfig();
  std::vector<std::vector<double>> sample_loss(kSteps, std::vector<double>(kBatch));
  std::vector<double> tokens(kSteps, 0);
  for (int s = 0; s < kSteps; ++s) {
    for (int i = 0; i < kBatch; ++i) {
      tokens[s] += MakeSequence(s, i, config.vocab_size).size() - kPrompt;
    }
  }
  RunResult out;
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    model::Model m(config, ops.get(), 64);
    ZeroOptions o;
    o.stage = stage;
    o.precision = precision;
    o.units = UnitsOf(m.layout());
    o.comm = &c;
    o.ops = ops.get();
    o.adamw = {0.9f, 0.95f, 1e-8f, 0.01f};
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    std::vector<float> init(m.layout().total_floats());
    m.InitParams(42, init.data());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    for (int s = 0; s < kSteps; ++s) {
      z.ZeroGrads();
      for (int mb = 0; mb < 2; ++mb) {
        // Sample i goes to rank i % n: every rank runs one pass per
        // micro-batch (N = 1 packs two sequences).
        model::Batch batch;
        std::vector<int> mine;
        std::vector<float> mask;
        for (int i = mb * 2; i < mb * 2 + 2; ++i) {
          if (i % n != c.rank()) continue;
          const auto seq = MakeSequence(s, i, config.vocab_size);
          batch.AddSequence(seq);
          mine.push_back(i);
          for (size_t k = 0; k + 1 < seq.size(); ++k) {
            mask.push_back(k + 1 >= kPrompt ? 1.f : 0.f);
          }
        }
        const int t = batch.num_tokens();
        std::vector<float> logp(t), dlogp(t);
        ASSERT_TRUE(m.ForwardLogprobs(batch, z, logp.data()).ok());
        for (int k = 0; k < t; ++k) {
          dlogp[k] = static_cast<float>(-mask[k] / tokens[s]);
        }
        for (int q = 0; q < batch.num_seqs(); ++q) {
          double sum = 0;
          for (int k = batch.cu_seqlens[q]; k < batch.cu_seqlens[q + 1]; ++k) {
            sum -= mask[k] * static_cast<double>(logp[k]);
          }
          sample_loss[s][mine[q]] = sum;
        }
        ASSERT_TRUE(m.Backward(dlogp.data(), z).ok());
        ASSERT_TRUE(z.status().ok()) << z.status();
      }
      auto r = z.Step(kLr, kClip);
      ASSERT_TRUE(r.ok()) << r.status();
    }
    std::vector<float> full(z.num_params());
    ASSERT_TRUE(z.GatherFull(full.data()).ok());
    if (c.rank() == 0) out.final_masters = std::move(full);
  });
  for (int s = 0; s < kSteps; ++s) {
    double sum = 0;
    for (double l : sample_loss[s]) sum += l;
    out.losses.push_back(sum / tokens[s]);
  }
  return out;
}

double Rel(double a, double b) {
  const double scale = std::max(std::fabs(a), std::fabs(b));
  return scale == 0 ? 0 : std::fabs(a - b) / scale;
}

TEST(ZeroBf16, TrainingMatchesAcrossRanksAndStagesAndFp32) {
  const RunResult fp32 = Train(Precision::kFp32, 0, 1);
  const RunResult base = Train(Precision::kBf16, 0, 1);
  ASSERT_EQ(base.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(base.losses.back(), 0.9 * base.losses.front()) << "it learns";
  double worst_fp32 = 0, any_diff = 0;
  for (int s = 0; s < kSteps; ++s) {
    worst_fp32 = std::max(worst_fp32, Rel(base.losses[s], fp32.losses[s]));
    any_diff = std::max(any_diff, Rel(base.losses[s], fp32.losses[s]));
  }
  std::printf(
      "[bf16] N=1 stage 0: loss %.5f -> %.5f (fp32 %.5f -> %.5f), "
      "largest rel diff to fp32 %.3g\n",
      base.losses.front(), base.losses.back(), fp32.losses.front(), fp32.losses.back(), worst_fp32);
  EXPECT_LE(worst_fp32, 2e-2);
  // The compute copy really is bf16: the losses are not the fp32 ones.
  EXPECT_GT(any_diff, 1e-6);
  for (int n : {1, 2}) {
    for (int stage = 0; stage <= 3; ++stage) {
      if (n == 1 && stage == 0) continue;
      const RunResult run = Train(Precision::kBf16, stage, n);
      ASSERT_EQ(run.losses.size(), base.losses.size());
      double worst = 0, worst_f = 0;
      for (int s = 0; s < kSteps; ++s) {
        worst = std::max(worst, Rel(run.losses[s], base.losses[s]));
        worst_f = std::max(worst_f, Rel(run.losses[s], fp32.losses[s]));
        EXPECT_LE(Rel(run.losses[s], base.losses[s]), 1e-5) << "N=" << n << " stage " << stage << " step " << s + 1;
      }
      double wdiff = 0;
      for (size_t i = 0; i < run.final_masters.size(); ++i) {
        wdiff = std::max(wdiff, std::fabs(double(run.final_masters[i]) - base.final_masters[i]));
      }
      std::printf(
          "[bf16] N=%d stage %d: largest per-step loss rel diff %.3g "
          "(vs fp32 %.3g), final masters max abs diff %.3g\n",
          n, stage, worst, worst_f, wdiff);
      EXPECT_LE(worst_f, 2e-2);
      EXPECT_LE(wdiff, 1e-4);
    }
  }
}

bool IsBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0xffffu) == 0;
}

// Every unit the model reads equals bf16(master), bit for bit, on every rank.
void ExpectComputeCopy(ZeroOptimizer& z, model::ParamProvider& p, const std::vector<float>& masters, const char* what) {
  const auto& units = z.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const float* w = p.AcquireParams(static_cast<int>(u));
    for (size_t i = 0; i < units[u].size; ++i) {
      const float want = kernels::FloatFromBf16(kernels::Bf16FromFloat(masters[units[u].offset + i]));
      ASSERT_TRUE(IsBf16(w[i])) << what << " unit " << u << " [" << i << "]";
      ASSERT_EQ(std::memcmp(&w[i], &want, 4), 0)
          << what << " unit " << u << " [" << i << "]: " << w[i] << " vs " << want;
    }
    p.ReleaseParams(static_cast<int>(u));
  }
}

// A few steps of a synthetic gradient on units of odd sizes.
std::vector<Unit> OddUnits() {
  std::vector<Unit> units;
  size_t off = 0;
  for (size_t size : {7, 33, 1, 64, 19}) {
    units.push_back({off, size});
    off += size;
  }
  return units;
}

void FakeBackward(ZeroOptimizer& z, int step) {
  for (int u = static_cast<int>(z.units().size()) - 1; u >= 0; --u) {
    const float* w = z.AcquireParams(u);
    float* g = z.AcquireGrads(u);
    for (size_t i = 0; i < z.units()[u].size; ++i) {
      g[i] += w[i] * 0.5f + std::sin(0.3f * i + step + u) * 1e-2f;
    }
    z.ReleaseGrads(u);
    z.ReleaseParams(u);
  }
}

TEST(ZeroBf16, ComputeCopyIsRoundedMasterOnEveryRankAndSurvivesReload) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int n : {1, 2, 3}) {
      RunRanks(n, [&](comm::Collective& c) {
        auto ops = kernels::MakeCpuOps(1);
        ZeroOptions o;
        o.stage = stage;
        o.precision = Precision::kBf16;
        o.units = OddUnits();
        o.comm = &c;
        o.ops = ops.get();
        auto opt = ZeroOptimizer::Create(o);
        ASSERT_TRUE(opt.ok()) << opt.status();
        ZeroOptimizer& z = **opt;
        std::vector<float> init(z.num_params());
        for (size_t i = 0; i < init.size(); ++i) init[i] = std::cos(1.3f * i) / 3;
        ASSERT_TRUE(z.InitFromFull(init.data()).ok());
        ExpectComputeCopy(z, z, init, "after init");
        for (int s = 0; s < 3; ++s) {
          z.ZeroGrads();
          FakeBackward(z, s);
          ASSERT_TRUE(z.Step(1e-2f, 0.f).ok());
        }
        std::vector<float> masters(z.num_params());
        ASSERT_TRUE(z.GatherFull(masters.data()).ok());
        // The masters moved off the bf16 grid; the compute copy did not.
        size_t off_grid = 0;
        for (float x : masters) off_grid += !IsBf16(x);
        EXPECT_GT(off_grid, masters.size() / 2);
        ExpectComputeCopy(z, z, masters, "after steps");
        // Inference serves the same rounded weights.
        if (stage < 3) ExpectComputeCopy(z, z.inference_view(), masters, "view");
        ASSERT_TRUE(z.BeginInference().ok());
        ExpectComputeCopy(z, z.inference_view(), masters, "inference");
        z.EndInference();

        // Checkpoint shards hold the fp32 masters; reload into another stage.
        std::vector<float> shard(z.shard_size()), m(z.shard_size()), v(z.shard_size());
        z.CopyParamShard(shard.data());
        z.CopyOptimizerShard(m.data(), v.data());
        for (const auto& p : z.shard_map()) {
          for (size_t i = 0; i < p.size; ++i) {
            ASSERT_EQ(shard[p.shard_offset + i], masters[z.units()[p.unit].offset + p.unit_offset + i]);
          }
        }
        ZeroOptions o2 = o;
        o2.stage = (stage + 1) % 4;
        auto opt2 = ZeroOptimizer::Create(o2);
        ASSERT_TRUE(opt2.ok());
        ZeroOptimizer& z2 = **opt2;
        std::vector<float> zeros(z2.num_params(), 0.f);
        ASSERT_TRUE(z2.InitFromFull(zeros.data()).ok());
        z2.LoadParamShard(shard.data());
        ASSERT_TRUE(z2.AllgatherParams().ok());
        z2.LoadOptimizerShard(m.data(), v.data());
        ASSERT_TRUE(z2.AllgatherOptimizerState().ok());
        std::vector<float> masters2(z2.num_params());
        ASSERT_TRUE(z2.GatherFull(masters2.data()).ok());
        ASSERT_EQ(masters2, masters);
        ExpectComputeCopy(z2, z2, masters, "after reload");
      });
    }
  }
}

TEST(ZeroBf16, Stage3AllgatherMovesHalfTheBytes) {
  // Units whose pieces are even for N = 2 (exactly half) and odd ones
  // (half plus at most one padding element per rank and unit).
  for (bool even : {true, false}) {
    std::vector<Unit> units;
    size_t off = 0;
    for (int u = 0; u < 6; ++u) {
      const size_t size = even ? 4000 + 8 * u : 4001 + 6 * u;
      units.push_back({off, size});
      off += size;
    }
    uint64_t received[2] = {0, 0};
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      RunRanks(2, [&](comm::Collective& c) {
        auto ops = kernels::MakeReferenceOps();
        ZeroOptions o;
        o.stage = 3;
        o.precision = precision;
        o.units = units;
        o.comm = &c;
        o.ops = ops.get();
        auto opt = ZeroOptimizer::Create(o);
        ASSERT_TRUE(opt.ok());
        ZeroOptimizer& z = **opt;
        std::vector<float> init(z.num_params(), 0.25f);
        ASSERT_TRUE(z.InitFromFull(init.data()).ok());
        c.ResetBytes();
        for (int u = 0; u < 6; ++u) {  // a forward pass with prefetching
          z.Prefetch(u + 1 < 6 ? u + 1 : -1);
          const float* w = z.AcquireParams(u);
          EXPECT_EQ(w[units[u].size - 1], 0.25f);
          z.ReleaseParams(u);
        }
        ASSERT_TRUE(z.Drain().ok());
        if (c.rank() == 0) {
          received[precision == Precision::kBf16] = c.bytes(comm::CollectiveKind::kAllgather).received;
        }
      });
    }
    std::printf(
        "[bf16] stage 3 N=2 %s units: allgather received fp32 %llu B, "
        "bf16 %llu B (ratio %.4f)\n",
        even ? "even" : "odd", (unsigned long long)received[0], (unsigned long long)received[1],
        double(received[1]) / double(received[0]));
    ASSERT_GT(received[0], 0u);
    if (even) {
      EXPECT_EQ(received[1] * 2, received[0]);
    } else {
      EXPECT_LE(received[1], received[0] / 2 + 6 * 4);
      EXPECT_GE(received[1], received[0] / 2);
    }
  }
}

// Per-rank memory in bf16 mode vs the formulas (zero_optimizer.h), within
// 5%; temporaries bounded by a few unit sizes.
TEST(ZeroBf16, MemoryMatchesFormulas) {
  std::vector<Unit> units;
  size_t off = 0;
  for (int u = 0; u < 12; ++u) {
    const size_t size = 100003 + 17 * u;
    units.push_back({off, size});
    off += size;
  }
  const double psi = off;
  size_t max_unit = 0;
  for (auto& u : units) max_unit = std::max(max_unit, u.size);
  std::printf("Psi = %.0f params\n", psi);
  for (int n : {1, 2, 3}) {
    for (int stage = 0; stage <= 3; ++stage) {
      std::vector<MemoryReport> reports(n);
      RunRanks(n, [&](comm::Collective& c) {
        auto ops = kernels::MakeReferenceOps();
        ZeroOptions o;
        o.stage = stage;
        o.precision = Precision::kBf16;
        o.units = units;
        o.comm = &c;
        o.ops = ops.get();
        auto opt = ZeroOptimizer::Create(o);
        ASSERT_TRUE(opt.ok());
        ZeroOptimizer& z = **opt;
        std::vector<float> init(z.num_params(), 0.01f);
        ASSERT_TRUE(z.InitFromFull(init.data()).ok());
        for (int u = 0; u < 12; ++u) {
          z.Prefetch(u + 1 < 12 ? u + 1 : 0);
          z.AcquireParams(u);
          z.ReleaseParams(u);
        }
        for (int u = 11; u >= 0; --u) {
          z.AcquireParams(u);
          float* g = z.AcquireGrads(u);
          g[0] += 1.f;
          z.ReleaseGrads(u);
          z.ReleaseParams(u);
        }
        ASSERT_TRUE(z.Step(1e-3f, 1.f).ok());
        reports[c.rank()] = z.memory();
      });
      // master, compute copy, grads, m+v
      const double f[4][4] = {{4 * psi, 2 * psi, 4 * psi, 8 * psi},
                              {4 * psi / n, 2 * psi, 4 * psi, 8 * psi / n},
                              {4 * psi / n, 2 * psi, 4 * psi / n, 8 * psi / n},
                              {4 * psi / n, 2 * psi / n, 4 * psi / n, 8 * psi / n}};
      const double* e = f[stage];
      const double formula = e[0] + e[1] + e[2] + e[3];
      for (int r = 0; r < n; ++r) {
        const auto& m = reports[r];
        const double state = m.param_bytes + m.compute_bytes + m.grad_bytes + m.optimizer_bytes;
        if (r == 0) {
          std::printf(
              "bf16 stage %d N=%d rank 0: master %.2f MB bf16 %.2f MB grads "
              "%.2f MB m+v %.2f MB = %.2f MB (formula %.2f MB = %.2f Psi, "
              "%+.3f%%) + temp %.2f MB\n",
              stage, n, m.param_bytes / 1e6, m.compute_bytes / 1e6, m.grad_bytes / 1e6, m.optimizer_bytes / 1e6,
              state / 1e6, formula / 1e6, formula / psi, 100 * (state / formula - 1), m.temp_bytes / 1e6);
        }
        EXPECT_NEAR(m.param_bytes / e[0], 1.0, 0.05);
        EXPECT_NEAR(m.compute_bytes / e[1], 1.0, 0.05);
        EXPECT_NEAR(m.grad_bytes / e[2], 1.0, 0.05);
        EXPECT_NEAR(m.optimizer_bytes / e[3], 1.0, 0.05);
        EXPECT_NEAR(state / formula, 1.0, 0.05);
        EXPECT_LE(m.temp_bytes, 10 * max_unit * 4);
      }
    }
  }
}

TEST(ZeroBf16, ParsePrecision) {
  EXPECT_EQ(*ParsePrecision("fp32"), Precision::kFp32);
  EXPECT_EQ(*ParsePrecision(""), Precision::kFp32);
  EXPECT_EQ(*ParsePrecision("bf16"), Precision::kBf16);
  auto bad = ParsePrecision("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expected fp32 or bf16"), std::string::npos);
}

}  // namespace
}  // namespace tandem::zero
