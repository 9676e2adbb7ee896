// ZeRO stages 0-3 with N = 1, 2, 3 ranks (threads over one InMemoryStore,
// Gloo on 127.0.0.1) against a single-process reference AdamW, on a tiny
// chain "model" that calls the ParamProvider in the model's unit order
// (tied unit 0 used at both ends, prefetch hints, gradient accumulation over
// two micro-batches, clipping). Also: per-rank memory vs the ZeRO formulas,
// stage 3 inference gathering, shard maps.
#include <cmath>
#include <cstdio>
#include <numeric>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "tests/support/run_ranks.h"
#include "worker/comm/collective.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

constexpr int kD = 4;       // width: unit 0 / L+1 have 4 params (uneven /3)
constexpr int kLayers = 3;  // units 1..3: W (4x4) + b (4) = 20 params
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

struct Sample {
  float u, t;
};

Sample MakeSample(int step, int index) {
  // Derived from (step, index) only - never from the rank.
  const float a = std::sin(0.37f * index + 1.3f * step + 0.1f);
  return {a, 0.5f * std::cos(0.11f * index - 0.7f * step)};
}

// One forward/backward of `s` through provider `p`; gradients are added with
// weight `w` (the global 1/B normalisation).
void ForwardBackward(model::ParamProvider& p, const Sample& s, float w) {
  std::vector<std::array<float, kD>> x(kLayers + 1);
  // forward
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
  // head (tied to unit 0) + loss; unit 0 stays acquired through backward
  p.Prefetch(kUnits - 1);
  e = p.AcquireParams(0);
  float z = 0;
  for (int i = 0; i < kD; ++i) z += e[i] * y[i];
  const float dz = w * (z - s.t);
  float* de = p.AcquireGrads(0);
  std::array<float, kD> dx;
  for (int i = 0; i < kD; ++i) {
    de[i] += dz * y[i];
    dx[i] = dz * e[i];  // dy
  }
  // backward through the final scale
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

// Plain full-buffer provider for the reference.
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
constexpr int kBatch = 6;  // global samples per step (2 micro-batches)
constexpr float kLr = 0.02f, kClip = 0.05f;
const AdamWConfig kAdam{0.9f, 0.99f, 1e-8f, 0.01f};

std::vector<float> InitialParams(size_t psi) {
  std::vector<float> p(psi);
  for (size_t i = 0; i < psi; ++i) p[i] = 0.5f * std::sin(1.7f * i + 0.3f);
  return p;
}

std::vector<float> Reference(std::vector<double>* norms) {
  auto units = TinyUnits();
  const size_t psi = units.back().offset + units.back().size;
  std::vector<float> params = InitialParams(psi), grads(psi), m(psi), v(psi);
  auto ops = kernels::MakeReferenceOps();
  FullProvider p(units, &params, &grads);
  for (int step = 0; step < kSteps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.f);
    for (int i = 0; i < kBatch; ++i) {
      ForwardBackward(p, MakeSample(step, i), 1.f / kBatch);
    }
    double sq = 0;
    for (float g : grads) sq += double(g) * g;
    const double norm = std::sqrt(sq);
    norms->push_back(norm);
    const double coef = kClip / (norm + 1e-6);
    if (coef < 1) ops->scale(grads.data(), float(coef), psi);
    ops->adamw_step(params.data(), grads.data(), m.data(), v.data(), psi, kLr, kAdam.beta1, kAdam.beta2, kAdam.eps,
                    kAdam.weight_decay, step + 1);
  }
  return params;
}

struct RankResult {
  std::vector<float> params;
  std::vector<double> norms;
};

using ::tandem::testing::RunRanks;

class StageRanks : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(StageRanks, MatchesSingleProcessAdamW) {
  const auto [stage, n] = GetParam();
  std::vector<double> ref_norms;
  const std::vector<float> ref = Reference(&ref_norms);
  std::vector<RankResult> results(n);
  RunRanks(n, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    ZeroOptions o;
    o.stage = stage;
    o.units = TinyUnits();
    o.comm = &c;
    o.ops = ops.get();
    o.adamw = kAdam;
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    ASSERT_TRUE(z.InitFromFull(InitialParams(z.num_params()).data()).ok());
    for (int step = 0; step < kSteps; ++step) {
      z.ZeroGrads();
      // Two micro-batches; sample i goes to rank i % n.
      for (int mb = 0; mb < 2; ++mb) {
        for (int i = mb * kBatch / 2; i < (mb + 1) * kBatch / 2; ++i) {
          if (i % n == c.rank()) {
            ForwardBackward(z, MakeSample(step, i), 1.f / kBatch);
          }
        }
        // Ranks without a sample in this micro-batch still release nothing;
        // stage 2/3 reduce-scatters are per unit release, so every rank must
        // run the same number of passes: give idle ranks a zero-weight pass.
        const int have = [&] {
          int k = 0;
          for (int i = mb * kBatch / 2; i < (mb + 1) * kBatch / 2; ++i) k += (i % n == c.rank());
          return k;
        }();
        const int most = (kBatch / 2 + n - 1) / n;
        for (int k = have; k < most; ++k) {
          ForwardBackward(z, MakeSample(step, 0), 0.f);
        }
      }
      ASSERT_TRUE(z.status().ok()) << z.status();
      auto r = z.Step(kLr, kClip);
      ASSERT_TRUE(r.ok()) << r.status();
      results[c.rank()].norms.push_back(r->grad_norm);
    }
    results[c.rank()].params.resize(z.num_params());
    ASSERT_TRUE(z.GatherFull(results[c.rank()].params.data()).ok());
  });
  double max_diff = 0, max_rel = 0;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(results[r].params.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::abs(double(results[r].params[i]) - ref[i]);
      max_diff = std::max(max_diff, d);
      max_rel = std::max(max_rel, d / std::max(std::abs(double(ref[i])), 1e-2));
    }
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(results[r].norms[s], ref_norms[s], 1e-5 * ref_norms[s]);
    }
  }
  std::printf("stage %d N=%d: max |diff| %.3g, max rel diff %.3g (norm[0] %.4g)\n", stage, n, max_diff, max_rel,
              ref_norms[0]);
  EXPECT_LE(max_rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Zero, StageRanks,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3)));

// Per-rank memory: params+grads+optimizer within 5% of the fp32 formulas,
// temporaries bounded by a few unit sizes.
TEST(ZeroMemory, MatchesFormulas) {
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
  std::printf("Psi = %.0f params (%.2f MB fp32)\n", psi, psi * 4 / 1e6);
  for (int n : {1, 2, 3}) {
    for (int stage = 0; stage <= 3; ++stage) {
      std::vector<MemoryReport> reports(n);
      RunRanks(n, [&](comm::Collective& c) {
        auto ops = kernels::MakeReferenceOps();
        ZeroOptions o;
        o.stage = stage;
        o.units = units;
        o.comm = &c;
        o.ops = ops.get();
        auto opt = ZeroOptimizer::Create(o);
        ASSERT_TRUE(opt.ok());
        ZeroOptimizer& z = **opt;
        std::vector<float> init(z.num_params(), 0.01f);
        ASSERT_TRUE(z.InitFromFull(init.data()).ok());
        // One pass in model order so temporaries get allocated.
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
      const double formula[4] = {16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n};
      for (int r = 0; r < n; ++r) {
        const auto& m = reports[r];
        const double state = m.param_bytes + m.grad_bytes + m.optimizer_bytes;
        std::printf(
            "stage %d N=%d rank %d: params %.2f MB grads %.2f MB optim %.2f MB"
            " = %.2f MB (formula %.2f MB, %.2f%%) + temp %.2f MB\n",
            stage, n, r, m.param_bytes / 1e6, m.grad_bytes / 1e6, m.optimizer_bytes / 1e6, state / 1e6,
            formula[stage] / 1e6, 100 * (state / formula[stage] - 1), m.temp_bytes / 1e6);
        EXPECT_NEAR(state / formula[stage], 1.0, 0.05);
        EXPECT_LE(m.temp_bytes, 8 * max_unit * 4);
      }
    }
  }
}

TEST(ZeroStage3, InferenceGathersOnceAndFrees) {
  RunRanks(2, [&](comm::Collective& c) {
    auto ops = kernels::MakeReferenceOps();
    ZeroOptions o;
    o.stage = 3;
    o.units = TinyUnits();
    o.comm = &c;
    o.ops = ops.get();
    auto opt = ZeroOptimizer::Create(o);
    ASSERT_TRUE(opt.ok());
    ZeroOptimizer& z = **opt;
    const auto init = InitialParams(z.num_params());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    const size_t before = z.memory().temp_bytes;
    ASSERT_TRUE(z.BeginInference().ok());
    EXPECT_GE(z.memory().temp_bytes, before + init.size() * 4);
    const auto units = TinyUnits();
    for (int u = 0; u < kUnits; ++u) {
      const float* p = z.inference_view().AcquireParams(u);
      const float* q = z.AcquireParams(u);
      for (size_t i = 0; i < units[u].size; ++i) {
        ASSERT_EQ(p[i], init[units[u].offset + i]);
        ASSERT_EQ(q[i], init[units[u].offset + i]);
      }
      z.ReleaseParams(u);
    }
    z.EndInference();
    EXPECT_EQ(z.memory().temp_bytes, before);
    // Shards of both ranks tile the vector.
    std::vector<float> shard(z.shard_size());
    z.CopyParamShard(shard.data());
    for (const auto& piece : z.shard_map()) {
      for (size_t i = 0; i < piece.size; ++i) {
        ASSERT_EQ(shard[piece.shard_offset + i], init[units[piece.unit].offset + piece.unit_offset + i]);
      }
    }
  });
}

TEST(ZeroShardMap, PiecesTileEveryUnit) {
  const auto units = TinyUnits();
  for (int n = 1; n <= 4; ++n) {
    std::vector<size_t> covered(units.size(), 0);
    for (int r = 0; r < n; ++r) {
      for (const auto& p : ComputeShardMap(units, r, n)) covered[p.unit] += p.size;
    }
    for (size_t u = 0; u < units.size(); ++u) EXPECT_EQ(covered[u], units[u].size);
  }
}

}  // namespace
}  // namespace tandem::zero
