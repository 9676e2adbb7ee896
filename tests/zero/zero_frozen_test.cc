// Frozen parameters in the ZeRO optimizer (ZeroOptions.trainable), stages
// 0-3 with N = 1, 2, 3 ranks as threads over Gloo: a table that covers
// everything is bit-identical to no table; with a subset trainable the
// frozen elements stay byte-identical and the trainable ones match a
// single-process AdamW that updates only them (norm and clipping over the
// trainable gradients); gradient and optimizer bytes shrink to the
// trainable share; checkpoint shards (same and other N) resume the run;
// bad tables are refused.
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "tests/support/run_ranks.h"
#include "worker/comm/collective.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using ::tandem::testing::RunRanks;

constexpr int kD = 4;
constexpr int kLayers = 3;  // units 1..3: W (4x4) + b (4)
constexpr int kUnits = kLayers + 2;

std::vector<Unit> TinyUnits() {
  std::vector<Unit> units;
  size_t off = 0;
  for (int u = 0; u < kUnits; ++u) {
    const size_t size = (u == 0 || u == kUnits - 1) ? kD : kD * kD + kD;
    units.push_back({off, size});
    off += size;
  }
  return units;
}

// Trainable: the embedding (unit 0), rows 1-2 of layer 1's W (crosses the
// piece boundaries for N = 2, 3), layer 3's bias; layer 2 and the final
// scale are frozen.
std::vector<std::vector<Unit>> SubsetTable() { return {{{0, 4}}, {{4, 8}}, {}, {{16, 4}}, {}}; }

std::vector<bool> TrainableMask(const std::vector<std::vector<Unit>>& table) {
  const auto units = TinyUnits();
  std::vector<bool> mask(units.back().offset + units.back().size, false);
  for (size_t u = 0; u < table.size(); ++u) {
    for (const Unit& r : table[u]) {
      for (size_t i = 0; i < r.size; ++i) mask[units[u].offset + r.offset + i] = true;
    }
  }
  return mask;
}

struct Sample {
  float u, t;
};

Sample MakeSample(int step, int index) {
  const float a = std::sin(0.37f * index + 1.3f * step + 0.1f);
  return {a, 0.5f * std::cos(0.11f * index - 0.7f * step)};
}

// One forward/backward through the provider in the model's unit order
// (unit 0 tied at both ends and held through backward).
void ForwardBackward(model::ParamProvider& p, const Sample& s, float w) {
  std::vector<std::array<float, kD>> x(kLayers + 1);
  p.Prefetch(0);
  const float* e = p.AcquireParams(0);
  for (int i = 0; i < kD; ++i) x[0][i] = s.u * e[i];
  p.ReleaseParams(0);
  for (int l = 1; l <= kLayers; ++l) {
    p.Prefetch(l + 1);
    const float* wb = p.AcquireParams(l);
    for (int i = 0; i < kD; ++i) {
      float h = wb[kD * kD + i];
      for (int j = 0; j < kD; ++j) h += wb[i * kD + j] * x[l - 1][j];
      x[l][i] = std::tanh(h);
    }
    p.ReleaseParams(l);
  }
  const float* g = p.AcquireParams(kUnits - 1);
  std::array<float, kD> y;
  for (int i = 0; i < kD; ++i) y[i] = g[i] * x[kLayers][i];
  p.ReleaseParams(kUnits - 1);
  p.Prefetch(kUnits - 1);
  e = p.AcquireParams(0);
  float z = 0;
  for (int i = 0; i < kD; ++i) z += e[i] * y[i];
  const float dz = w * (z - s.t);
  float* de = p.AcquireGrads(0);
  std::array<float, kD> dx;
  for (int i = 0; i < kD; ++i) {
    de[i] += dz * y[i];
    dx[i] = dz * e[i];
  }
  g = p.AcquireParams(kUnits - 1);
  float* dg = p.AcquireGrads(kUnits - 1);
  for (int i = 0; i < kD; ++i) {
    dg[i] += dx[i] * x[kLayers][i];
    dx[i] *= g[i];
  }
  p.ReleaseGrads(kUnits - 1);
  p.ReleaseParams(kUnits - 1);
  for (int l = kLayers; l >= 1; --l) {
    p.Prefetch(l - 1);
    const float* wb = p.AcquireParams(l);
    float* dwb = p.AcquireGrads(l);
    std::array<float, kD> dh, dprev{};
    for (int i = 0; i < kD; ++i) dh[i] = dx[i] * (1 - x[l][i] * x[l][i]);
    for (int i = 0; i < kD; ++i) {
      dwb[kD * kD + i] += dh[i];
      for (int j = 0; j < kD; ++j) {
        dwb[i * kD + j] += dh[i] * x[l - 1][j];
        dprev[j] += wb[i * kD + j] * dh[i];
      }
    }
    dx = dprev;
    p.ReleaseGrads(l);
    p.ReleaseParams(l);
  }
  for (int i = 0; i < kD; ++i) de[i] += s.u * dx[i];
  p.ReleaseGrads(0);
  p.ReleaseParams(0);
}

class FullProvider : public model::ParamProvider {
 public:
  FullProvider(std::vector<Unit> units, std::vector<float>* params, std::vector<float>* grads)
      : units_(std::move(units)), params_(params), grads_(grads) {}
  const float* AcquireParams(int u) override { return params_->data() + units_[u].offset; }
  void ReleaseParams(int) override {}
  float* AcquireGrads(int u) override { return grads_->data() + units_[u].offset; }
  void ReleaseGrads(int) override {}

 private:
  std::vector<Unit> units_;
  std::vector<float>* params_;
  std::vector<float>* grads_;
};

constexpr int kSteps = 6;
constexpr int kBatch = 6;
constexpr float kLr = 0.02f, kClip = 0.05f;
const AdamWConfig kAdam{0.9f, 0.99f, 1e-8f, 0.01f};

std::vector<float> InitialParams(size_t psi) {
  std::vector<float> p(psi);
  for (size_t i = 0; i < psi; ++i) p[i] = 0.5f * std::sin(1.7f * i + 0.3f);
  return p;
}

// Single process: the full gradient, then norm, clipping and AdamW over the
// trainable elements only; frozen elements get no update at all.
std::vector<float> Reference(const std::vector<bool>& mask, std::vector<double>* norms) {
  const auto units = TinyUnits();
  const size_t psi = units.back().offset + units.back().size;
  std::vector<float> params = InitialParams(psi), grads(psi), m(psi), v(psi);
  auto ops = kernels::MakeReferenceOps();
  FullProvider p(units, &params, &grads);
  for (int step = 0; step < kSteps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.f);
    for (int i = 0; i < kBatch; ++i) ForwardBackward(p, MakeSample(step, i), 1.f / kBatch);
    double sq = 0;
    for (size_t i = 0; i < psi; ++i) sq += mask[i] ? double(grads[i]) * grads[i] : 0.0;
    const double norm = std::sqrt(sq);
    norms->push_back(norm);
    const double coef = kClip / (norm + 1e-6);
    for (size_t i = 0; i < psi; ++i) {
      if (!mask[i]) continue;
      if (coef < 1) grads[i] *= float(coef);
      ops->adamw_step(&params[i], &grads[i], &m[i], &v[i], 1, kLr, kAdam.beta1, kAdam.beta2, kAdam.eps,
                      kAdam.weight_decay, step + 1);
    }
  }
  return params;
}

ZeroOptions MakeOptions(int stage, comm::Collective& c, kernels::Ops* ops, std::vector<std::vector<Unit>> table) {
  ZeroOptions o;
  o.stage = stage;
  o.units = TinyUnits();
  o.comm = &c;
  o.ops = ops;
  o.adamw = kAdam;
  o.trainable = std::move(table);
  return o;
}

// Steps [first, last) of the run on `z`: two micro-batches per step, sample
// i on rank i % n, idle ranks run zero-weight passes (same collectives).
void Train(ZeroOptimizer& z, int rank, int n, int first, int last, std::vector<double>* norms) {
  for (int step = first; step < last; ++step) {
    z.ZeroGrads();
    for (int mb = 0; mb < 2; ++mb) {
      int have = 0;
      for (int i = mb * kBatch / 2; i < (mb + 1) * kBatch / 2; ++i) {
        if (i % n == rank) {
          ForwardBackward(z, MakeSample(step, i), 1.f / kBatch);
          ++have;
        }
      }
      const int most = (kBatch / 2 + n - 1) / n;
      for (int k = have; k < most; ++k) ForwardBackward(z, MakeSample(step, 0), 0.f);
    }
    ASSERT_TRUE(z.status().ok()) << z.status();
    auto r = z.Step(kLr, kClip);
    ASSERT_TRUE(r.ok()) << r.status();
    if (norms != nullptr) norms->push_back(r->grad_norm);
  }
}

struct RankResult {
  std::vector<float> params;
  std::vector<double> norms;
};

std::vector<RankResult> RunJob(int stage, int n, const std::vector<std::vector<Unit>>& table) {
  std::vector<RankResult> results(n);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    auto opt = ZeroOptimizer::Create(MakeOptions(stage, c, ops.get(), table));
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    ASSERT_TRUE(z.InitFromFull(InitialParams(z.num_params()).data()).ok());
    Train(z, c.rank(), n, 0, kSteps, &results[c.rank()].norms);
    results[c.rank()].params.resize(z.num_params());
    ASSERT_TRUE(z.GatherFull(results[c.rank()].params.data()).ok());
  });
  return results;
}

class FrozenStageRanks : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(FrozenStageRanks, FullTableIsBitIdenticalToNoTable) {
  const auto [stage, n] = GetParam();
  std::vector<std::vector<Unit>> full;
  for (const Unit& u : TinyUnits()) full.push_back({{0, u.size}});
  const auto plain = RunJob(stage, n, {});
  const auto covered = RunJob(stage, n, full);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(plain[r].params, covered[r].params) << "rank " << r;
    ASSERT_EQ(plain[r].norms, covered[r].norms) << "rank " << r;
  }
}

TEST_P(FrozenStageRanks, FrozenStayAndTrainableMatchReference) {
  const auto [stage, n] = GetParam();
  const auto table = SubsetTable();
  const auto mask = TrainableMask(table);
  std::vector<double> ref_norms;
  const std::vector<float> ref = Reference(mask, &ref_norms);
  const std::vector<float> init = InitialParams(ref.size());
  const auto results = RunJob(stage, n, table);
  double max_rel = 0;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].params.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      if (!mask[i]) {
        // Byte-identical: no update of any kind.
        ASSERT_EQ(std::memcmp(&results[r].params[i], &init[i], sizeof(float)), 0) << "frozen element " << i;
        continue;
      }
      ASSERT_NE(results[r].params[i], init[i]) << "trainable element " << i << " did not move";
      const double d = std::abs(double(results[r].params[i]) - ref[i]);
      max_rel = std::max(max_rel, d / std::max(std::abs(double(ref[i])), 1e-2));
    }
    for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(results[r].norms[s], ref_norms[s], 1e-5 * ref_norms[s]);
  }
  std::printf("frozen stage %d N=%d: max rel diff of trainable %.3g\n", stage, n, max_rel);
  EXPECT_LE(max_rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Zero, FrozenStageRanks,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3)));

// Gradient and optimizer bytes per rank: 12 units of ~100k floats, units 0
// and 5 trainable (each split evenly over the ranks, so every rank owns
// about T / N trainable elements).
TEST(ZeroFrozenMemory, GradientsAndMomentsCoverTrainableOnly) {
  std::vector<Unit> units;
  size_t off = 0;
  for (int u = 0; u < 12; ++u) {
    const size_t size = 100003 + 17 * u;
    units.push_back({off, size});
    off += size;
  }
  const double psi = off;
  std::vector<std::vector<Unit>> table(12);
  table[0] = {{0, units[0].size}};
  table[5] = {{0, units[5].size}};
  const double t = units[0].size + units[5].size;
  std::printf("Psi = %.0f, trainable T = %.0f (%.1f%%)\n", psi, t, 100 * t / psi);
  for (int n : {1, 2, 3}) {
    for (int stage = 0; stage <= 3; ++stage) {
      std::vector<MemoryReport> plain(n), frozen(n);
      for (bool with_table : {false, true}) {
        RunRanks(n, [&](comm::Collective& c) {
          auto ops = kernels::MakeReferenceOps();
          ZeroOptions o;
          o.stage = stage;
          o.units = units;
          o.comm = &c;
          o.ops = ops.get();
          if (with_table) o.trainable = table;
          auto opt = ZeroOptimizer::Create(o);
          ASSERT_TRUE(opt.ok()) << opt.status();
          ZeroOptimizer& z = **opt;
          std::vector<float> init(z.num_params(), 0.01f);
          ASSERT_TRUE(z.InitFromFull(init.data()).ok());
          for (int u = 11; u >= 0; --u) {
            z.AcquireParams(u);
            float* g = z.AcquireGrads(u);
            g[0] += 1.f;
            z.ReleaseGrads(u);
            z.ReleaseParams(u);
          }
          ASSERT_TRUE(z.Step(1e-3f, 1.f).ok());
          (with_table ? frozen : plain)[c.rank()] = z.memory();
        });
      }
      // Trainable elements a rank owns at stages 1-3: about T / N.
      const double grads_formula = stage <= 1 ? 4 * t : 4 * t / n;
      const double opt_formula = stage == 0 ? 8 * t : 8 * t / n;
      for (int r = 0; r < n; ++r) {
        const auto& p = plain[r];
        const auto& f = frozen[r];
        std::printf(
            "stage %d N=%d rank %d: grads %.2f -> %.2f MB, optim %.2f -> %.2f MB, params %.2f MB (same), "
            "temp %.2f -> %.2f MB\n",
            stage, n, r, p.grad_bytes / 1e6, f.grad_bytes / 1e6, p.optimizer_bytes / 1e6, f.optimizer_bytes / 1e6,
            f.param_bytes / 1e6, p.temp_bytes / 1e6, f.temp_bytes / 1e6);
        EXPECT_EQ(f.param_bytes, p.param_bytes);
        EXPECT_NEAR(f.grad_bytes / grads_formula, 1.0, 0.01);
        EXPECT_NEAR(f.optimizer_bytes / opt_formula, 1.0, 0.01);
        // Stages 0-1 add the unit-sized gradient buffers of stages 2-3.
        size_t max_unit = 0;
        for (const Unit& u : units) max_unit = std::max(max_unit, u.size);
        EXPECT_LE(f.temp_bytes, p.temp_bytes + 3 * max_unit * sizeof(float));
      }
    }
  }
}

// This rank's shards (params, m, v) scattered into full vectors (zeros
// elsewhere), as a checkpoint holds them.
struct FullState {
  std::vector<float> params, m, v;
};

void AddShards(const ZeroOptimizer& z, FullState* full) {
  const size_t n = z.shard_size();
  std::vector<float> p(n), m(n), v(n);
  z.CopyParamShard(p.data());
  z.CopyOptimizerShard(m.data(), v.data());
  for (const ShardPiece& piece : z.shard_map()) {
    const size_t at = z.units()[piece.unit].offset + piece.unit_offset;
    for (size_t i = 0; i < piece.size; ++i) {
      full->params[at + i] = p[piece.shard_offset + i];
      full->m[at + i] = m[piece.shard_offset + i];
      full->v[at + i] = v[piece.shard_offset + i];
    }
  }
}

void LoadShards(ZeroOptimizer& z, const FullState& full) {
  const size_t n = z.shard_size();
  std::vector<float> p(n), m(n), v(n);
  for (const ShardPiece& piece : z.shard_map()) {
    const size_t at = z.units()[piece.unit].offset + piece.unit_offset;
    for (size_t i = 0; i < piece.size; ++i) {
      p[piece.shard_offset + i] = full.params[at + i];
      m[piece.shard_offset + i] = full.m[at + i];
      v[piece.shard_offset + i] = full.v[at + i];
    }
  }
  z.LoadParamShard(p.data());
  ASSERT_TRUE(z.AllgatherParams().ok());
  z.LoadOptimizerShard(m.data(), v.data());
  ASSERT_TRUE(z.AllgatherOptimizerState().ok());
}

// Checkpoint after 3 steps at N ranks, resume at M ranks for the other 3:
// equal to the uninterrupted run (bit for bit at M = N); frozen moments
// read as 0 in the checkpoint.
class FrozenResume : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(FrozenResume, EqualsUninterruptedRun) {
  const auto [stage, n, m] = GetParam();
  const auto table = SubsetTable();
  const auto mask = TrainableMask(table);
  const auto uninterrupted = RunJob(stage, n, table);
  const size_t psi = mask.size();
  FullState saved{std::vector<float>(psi), std::vector<float>(psi), std::vector<float>(psi)};
  std::mutex mu;
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    auto opt = ZeroOptimizer::Create(MakeOptions(stage, c, ops.get(), table));
    ASSERT_TRUE(opt.ok()) << opt.status();
    ASSERT_TRUE((*opt)->InitFromFull(InitialParams(psi).data()).ok());
    Train(**opt, c.rank(), n, 0, kSteps / 2, nullptr);
    ASSERT_TRUE((*opt)->Drain().ok());
    std::lock_guard<std::mutex> lock(mu);
    AddShards(**opt, &saved);
  });
  for (size_t i = 0; i < psi; ++i) {
    if (!mask[i]) {
      ASSERT_EQ(saved.m[i], 0.f) << i;
      ASSERT_EQ(saved.v[i], 0.f) << i;
    }
  }
  std::vector<std::vector<float>> resumed(m);
  RunRanks(m, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    auto opt = ZeroOptimizer::Create(MakeOptions(stage, c, ops.get(), table));
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    ASSERT_TRUE(z.InitFromFull(std::vector<float>(psi, 0.f).data()).ok());
    LoadShards(z, saved);
    z.set_step_count(kSteps / 2);
    Train(z, c.rank(), m, kSteps / 2, kSteps, nullptr);
    resumed[c.rank()].resize(psi);
    ASSERT_TRUE(z.GatherFull(resumed[c.rank()].data()).ok());
  });
  for (int r = 0; r < m; ++r) {
    for (size_t i = 0; i < psi; ++i) {
      if (m == n) {
        ASSERT_EQ(resumed[r][i], uninterrupted[0].params[i]) << "rank " << r << " element " << i;
      } else {
        ASSERT_NEAR(resumed[r][i], uninterrupted[0].params[i], 1e-5 * std::max(1.f, std::abs(resumed[r][i])))
            << "rank " << r << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, FrozenResume,
                         ::testing::Values(std::make_tuple(0, 2, 2), std::make_tuple(3, 2, 2), std::make_tuple(0, 2, 3),
                                           std::make_tuple(3, 3, 2), std::make_tuple(1, 2, 2),
                                           std::make_tuple(2, 2, 3)));

TEST(ZeroFrozenTable, BadTablesAreRefused) {
  RunRanks(1, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    const std::vector<std::pair<std::vector<std::vector<Unit>>, std::string>> bad = {
        {{{{0, 4}}}, "trainable table has 1 units"},
        {{{}, {}, {}, {}, {}}, "no trainable parameters"},
        {{{{0, 5}}, {}, {}, {}, {}}, "outside the unit"},
        {{{}, {{4, 4}, {2, 4}}, {}, {}, {}}, "out of order, overlapping"},
        {{{}, {{4, 0}}, {}, {}, {}}, "empty"},
    };
    for (const auto& [table, want] : bad) {
      auto opt = ZeroOptimizer::Create(MakeOptions(0, c, ops.get(), table));
      ASSERT_FALSE(opt.ok());
      EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(opt.status().message().find(want), std::string::npos) << opt.status();
    }
    ZeroOptions o = MakeOptions(2, c, ops.get(), SubsetTable());
    o.grad_compression = GradCompression::kInt4;
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_FALSE(opt.ok());
    EXPECT_NE(opt.status().message().find("int4"), std::string::npos) << opt.status();
  });
}

TEST(ZeroFrozenOffload, MomentsSurviveOffload) {
  RunRanks(2, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    auto opt = ZeroOptimizer::Create(MakeOptions(3, c, ops.get(), SubsetTable()));
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    ASSERT_TRUE(z.InitFromFull(InitialParams(z.num_params()).data()).ok());
    Train(z, c.rank(), 2, 0, 2, nullptr);
    std::vector<float> m0(z.shard_size()), v0(z.shard_size()), m1(z.shard_size()), v1(z.shard_size());
    z.CopyOptimizerShard(m0.data(), v0.data());
    ASSERT_TRUE(z.OffloadOptimizerState().ok());
    EXPECT_EQ(z.memory().optimizer_bytes, 0u);
    z.CopyOptimizerShard(m1.data(), v1.data());
    EXPECT_EQ(m0, m1);
    ASSERT_TRUE(z.RestoreOptimizerState().ok());
    z.CopyOptimizerShard(m1.data(), v1.data());
    EXPECT_EQ(v0, v1);
    EXPECT_EQ(z.num_trainable(), 16u);
  });
}

}  // namespace
}  // namespace tandem::zero
