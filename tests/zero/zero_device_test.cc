// ZeroOptimizer on backend device memory: the guarded backend (device
// addresses the host cannot touch: kernels/guarded/, guarded CPU ops, the
// guarded Gloo wrapper) against the host path, N = 1, 2, 3 ranks (threads)
// x stages 0-3 x fp32/bf16:
//  * synthetic gradients written through AcquireGrads with memory copies,
//    stage 3 prefetching, a tied unit 0 held across the pass, gradient
//    accumulation, clipping, inference: losses, norms, masters, moments,
//    inference weights and memory() identical BIT FOR BIT;
//  * a tiny Llama model (worker/model) on the same memory: per-token
//    log-probabilities, masters and moments identical bit for bit;
//  * OffloadOptimizerState / RestoreOptimizerState free and restore the
//    device moments, and training continues identically;
//  * int8 weight gathers (qwZ) at stage 3, fp32 and bf16: identical BIT FOR
//    BIT too;
//  * a failed allocation is ResourceExhausted with the byte count.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/guarded/guarded_memory.h"
#include "kernels/memory.h"
#include "tests/support/run_ranks.h"
#include "tests/zero/zero_test_model.h"
#include "worker/comm/collective.h"
#include "worker/comm/guarded_collective.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero {
namespace {

using Param = std::tuple<int, int, Precision>;  // ranks, stage, precision

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [n, stage, precision] = info.param;
  return "N" + std::to_string(n) + "_stage" + std::to_string(stage) +
         (precision == Precision::kBf16 ? "_bf16" : "_fp32");
}

constexpr size_t kCapacity = size_t{256} << 20;  // guarded reservation per rank

// One rank's backend: guarded (memory, ops and collective) or host.
struct Backend {
  std::unique_ptr<kernels::GuardedMemory> guarded;
  std::unique_ptr<kernels::DeviceMemory> host;
  kernels::DeviceMemory* memory = nullptr;
  std::unique_ptr<kernels::Ops> ops, comm_ops;
  std::unique_ptr<comm::Collective> comm;
};

// Runs fn(backend) on n threads, one rank each, over Gloo on 127.0.0.1.
void RunRanks(int n, bool guarded, const std::function<void(Backend&)>& fn) {
  ::tandem::testing::RunRankThreads(n, [&](int, std::unique_ptr<comm::Collective> c) {
    Backend b;
    if (guarded) {
      b.guarded = kernels::MakeGuardedMemory(kCapacity);
      b.memory = b.guarded.get();
      b.ops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), b.guarded.get());
      b.comm_ops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), b.guarded.get());
      b.comm = comm::MakeGuardedCollective(std::move(c), b.guarded.get());
    } else {
      b.host = kernels::MakeHostMemory();
      b.memory = b.host.get();
      b.ops = kernels::MakeCpuOps(1);
      b.comm_ops = kernels::MakeCpuOps(1);
      b.comm = std::move(c);
    }
    fn(b);
  });
}

ZeroOptions OptionsFor(Backend& b, int stage, Precision precision, std::vector<Unit> units) {
  ZeroOptions o;
  o.stage = stage;
  o.precision = precision;
  o.units = std::move(units);
  o.comm = b.comm.get();
  o.ops = b.ops.get();
  o.comm_ops = b.comm_ops.get();
  o.memory = b.memory;
  o.adamw = {0.9f, 0.95f, 1e-8f, 0.01f};
  return o;
}

// What one rank saw and ended with.
struct Record {
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<float> logp;     // model test: every micro-batch's logp
  std::vector<float> masters;  // GatherFull
  std::vector<float> shard, m, v;
  std::vector<float> infer;  // inference_view after BeginInference
  MemoryReport mem;
};

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

void ExpectSameMemory(const MemoryReport& a, const MemoryReport& b, const std::string& what) {
  EXPECT_EQ(a.param_bytes, b.param_bytes) << what;
  EXPECT_EQ(a.compute_bytes, b.compute_bytes) << what;
  EXPECT_EQ(a.grad_bytes, b.grad_bytes) << what;
  EXPECT_EQ(a.optimizer_bytes, b.optimizer_bytes) << what;
  EXPECT_EQ(a.temp_bytes, b.temp_bytes) << what;
  EXPECT_EQ(a.offloaded_bytes, b.offloaded_bytes) << what;
}

void ExpectSameRecords(const std::vector<Record>& host, const std::vector<Record>& dev, const std::string& what) {
  ASSERT_EQ(host.size(), dev.size());
  for (size_t r = 0; r < host.size(); ++r) {
    const std::string w = what + " rank " + std::to_string(r);
    EXPECT_TRUE(SameBits(host[r].losses, dev[r].losses)) << w << ": losses";
    EXPECT_TRUE(SameBits(host[r].norms, dev[r].norms)) << w << ": norms";
    EXPECT_TRUE(SameBits(host[r].logp, dev[r].logp)) << w << ": logp";
    EXPECT_TRUE(SameBits(host[r].masters, dev[r].masters)) << w << ": masters";
    EXPECT_TRUE(SameBits(host[r].shard, dev[r].shard)) << w << ": shard";
    EXPECT_TRUE(SameBits(host[r].m, dev[r].m)) << w << ": m";
    EXPECT_TRUE(SameBits(host[r].v, dev[r].v)) << w << ": v";
    EXPECT_TRUE(SameBits(host[r].infer, dev[r].infer)) << w << ": inference";
    ExpectSameMemory(host[r].mem, dev[r].mem, w);
  }
}

// Downloads every unit the provider serves (device pointers) in unit order.
std::vector<float> ReadAll(ZeroOptimizer& z, model::ParamProvider& p) {
  std::vector<float> out(z.num_params());
  for (size_t u = 0; u < z.units().size(); ++u) {
    const float* w = p.AcquireParams(static_cast<int>(u));
    z.device_memory()->CopyToHost(out.data() + z.units()[u].offset, w, z.units()[u].size * sizeof(float));
    p.ReleaseParams(static_cast<int>(u));
  }
  return out;
}

void Finish(ZeroOptimizer& z, Record& rec) {
  rec.masters.resize(z.num_params());
  ASSERT_TRUE(z.GatherFull(rec.masters.data()).ok());
  rec.shard.resize(z.shard_size());
  rec.m.resize(z.shard_size());
  rec.v.resize(z.shard_size());
  z.CopyParamShard(rec.shard.data());
  z.CopyOptimizerShard(rec.m.data(), rec.v.data());
  rec.mem = z.memory();
}

// ---- synthetic gradients ------------------------------------------------------

std::vector<Unit> OddUnits() {
  std::vector<Unit> units;
  size_t off = 0;
  for (size_t size : {7, 33, 1, 64, 19, 40}) {
    units.push_back({off, size});
    off += size;
  }
  return units;
}

std::vector<float> InitFull(size_t psi) {
  std::vector<float> init(psi);
  for (size_t i = 0; i < psi; ++i) init[i] = std::cos(1.3f * i) / 3;
  return init;
}

// One pass in the model's call pattern (unit 0 held throughout, prefetch
// hints), reading weights and adding a gradient through memory copies.
void SyntheticPass(ZeroOptimizer& z, int step, int pass, int rank, double* loss) {
  kernels::DeviceMemory* mem = z.device_memory();
  const auto& units = z.units();
  const int n_units = static_cast<int>(units.size());
  std::vector<float> w, g;
  const float* tied = z.AcquireParams(0);
  ASSERT_NE(tied, nullptr);
  for (int u = 0; u < n_units; ++u) {
    z.Prefetch(u + 1 < n_units ? u + 1 : -1);
    const float* p = u == 0 ? tied : z.AcquireParams(u);
    ASSERT_NE(p, nullptr);
    w.resize(units[u].size);
    mem->CopyToHost(w.data(), p, w.size() * sizeof(float));
    for (size_t i = 0; i < w.size(); ++i) {
      *loss += static_cast<double>(w[i]) * std::sin(0.1 * i + u + step + pass);
    }
    if (u != 0) z.ReleaseParams(u);
  }
  for (int u = n_units - 1; u >= 0; --u) {
    z.Prefetch(u - 1);
    const float* p = z.AcquireParams(u);
    float* d = z.AcquireGrads(u);
    ASSERT_NE(p, nullptr);
    ASSERT_NE(d, nullptr);
    w.resize(units[u].size);
    g.resize(units[u].size);
    mem->CopyToHost(w.data(), p, w.size() * sizeof(float));
    mem->CopyToHost(g.data(), d, g.size() * sizeof(float));
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] += 0.5f * w[i] + 0.05f * std::sin(0.3f * i + step + 2 * pass + u + 0.7f * rank);
    }
    mem->CopyToDevice(d, g.data(), g.size() * sizeof(float));
    z.ReleaseGrads(u);
    z.ReleaseParams(u);
  }
  z.ReleaseParams(0);
}

std::vector<Record> TrainSynthetic(bool guarded, int n, int stage, Precision precision, bool offload,
                                   WeightQuantization weights = WeightQuantization::kNone) {
  std::vector<Record> records(n);
  RunRanks(n, guarded, [&](Backend& b) {
    ZeroOptions options = OptionsFor(b, stage, precision, OddUnits());
    options.weight_quantization = weights;
    auto opt = ZeroOptimizer::Create(options);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    Record& rec = records[b.comm->rank()];
    ASSERT_TRUE(z.InitFromFull(InitFull(z.num_params()).data()).ok());
    // The guarded run really hands out device addresses.
    const float* p0 = z.AcquireParams(0);
    if (guarded) {
      EXPECT_TRUE(b.guarded->Contains(p0));
      EXPECT_GT(b.guarded->allocated_bytes(), z.num_params() * sizeof(float));
    }
    z.ReleaseParams(0);
    for (int step = 0; step < 4; ++step) {
      z.ZeroGrads();
      double loss = 0;
      for (int pass = 0; pass < 2; ++pass) {
        SyntheticPass(z, step, pass, b.comm->rank(), &loss);
      }
      ASSERT_TRUE(z.status().ok()) << z.status();
      rec.losses.push_back(loss);
      auto r = z.Step(2e-2f, 0.5f);
      ASSERT_TRUE(r.ok()) << r.status();
      rec.norms.push_back(r->grad_norm);
      rec.norms.push_back(r->clip_scale);
      if (step == 1) {
        // A rollout in the middle (optionally with the moments offloaded).
        if (offload) ASSERT_TRUE(z.OffloadOptimizerState().ok());
        ASSERT_TRUE(z.BeginInference().ok());
        rec.infer = ReadAll(z, z.inference_view());
        z.EndInference();
        if (offload) ASSERT_TRUE(z.RestoreOptimizerState().ok());
      }
    }
    Finish(z, rec);
  });
  return records;
}

class DeviceSynthetic : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceSynthetic, GuardedMatchesHostBitForBit) {
  const auto [n, stage, precision] = GetParam();
  const std::vector<Record> host = TrainSynthetic(false, n, stage, precision, false);
  const std::vector<Record> dev = TrainSynthetic(true, n, stage, precision, false);
  ASSERT_EQ(host[0].norms.size(), 8u);
  EXPECT_LT(host[0].norms[1], 1.0) << "clipping is exercised";
  ExpectSameRecords(host, dev,
                    "N=" + std::to_string(n) + " stage " + std::to_string(stage) +
                        (precision == Precision::kBf16 ? " bf16" : " fp32"));
  std::printf("N=%d stage %d %s: guarded == host (norm[0] %.6g, temp %zu B)\n", n, stage,
              precision == Precision::kBf16 ? "bf16" : "fp32", host[0].norms[0], host[0].mem.temp_bytes);
}

// qwZ on device memory: the gathers quantise and dequantise with the
// backend's Ops in its own memory (the guarded backend aborts on any host
// access of a device address), bit for bit equal to the host run.
TEST(DeviceQuantized, GuardedMatchesHostBitForBit) {
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const char* name = precision == Precision::kBf16 ? "qwZ bf16" : "qwZ fp32";
    const std::vector<Record> host = TrainSynthetic(false, 2, 3, precision, false, WeightQuantization::kInt8);
    const std::vector<Record> dev = TrainSynthetic(true, 2, 3, precision, false, WeightQuantization::kInt8);
    ASSERT_EQ(host[0].norms.size(), 8u);
    ExpectSameRecords(host, dev, name);
    std::printf("N=2 stage 3 %s: guarded == host (norm[0] %.6g)\n", name, host[0].norms[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, DeviceSynthetic,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16)),
                         ParamName);

// ---- a tiny Llama model on the same memory -------------------------------------

using test_model::MakeSequence;
using test_model::TinyConfig;
using test_model::UnitsOf;

std::vector<Record> TrainModel(bool guarded, int n, int stage, Precision precision) {
  const model::ModelConfig config = TinyConfig();
  std::vector<Record> records(n);
  RunRanks(n, guarded, [&](Backend& b) {
    model::Model m(config, b.ops.get(), 64, b.memory);
    auto opt = ZeroOptimizer::Create(OptionsFor(b, stage, precision, UnitsOf(m.layout())));
    ASSERT_TRUE(opt.ok()) << opt.status();
    ZeroOptimizer& z = **opt;
    Record& rec = records[b.comm->rank()];
    std::vector<float> init(m.layout().total_floats());
    m.InitParams(42, init.data());
    ASSERT_TRUE(z.InitFromFull(init.data()).ok());
    const int rank = b.comm->rank();
    for (int s = 0; s < 3; ++s) {
      z.ZeroGrads();
      for (int mb = 0; mb < 2; ++mb) {
        model::Batch batch;
        std::vector<float> mask;
        for (int i = mb * 3; i < mb * 3 + 3; ++i) {
          if (i % n != rank) continue;
          const auto seq = MakeSequence(s, i, config.vocab_size);
          batch.AddSequence(seq);
          for (size_t k = 0; k + 1 < seq.size(); ++k) mask.push_back(k >= 4);
        }
        const int t = batch.num_tokens();
        std::vector<float> logp(t), dlogp(t);
        ASSERT_TRUE(m.ForwardLogprobs(batch, z, logp.data()).ok());
        for (int k = 0; k < t; ++k) dlogp[k] = -mask[k] / 40.f;
        rec.logp.insert(rec.logp.end(), logp.begin(), logp.end());
        ASSERT_TRUE(m.Backward(dlogp.data(), z).ok());
        ASSERT_TRUE(z.status().ok()) << z.status();
      }
      auto r = z.Step(3e-3f, 1.0f);
      ASSERT_TRUE(r.ok()) << r.status();
      rec.norms.push_back(r->grad_norm);
    }
    Finish(z, rec);
  });
  return records;
}

class DeviceModel : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceModel, GuardedMatchesHostBitForBit) {
  const auto [n, stage, precision] = GetParam();
  const std::vector<Record> host = TrainModel(false, n, stage, precision);
  const std::vector<Record> dev = TrainModel(true, n, stage, precision);
  ASSERT_FALSE(host[0].logp.empty());
  ExpectSameRecords(host, dev,
                    "model N=" + std::to_string(n) + " stage " + std::to_string(stage) +
                        (precision == Precision::kBf16 ? " bf16" : " fp32"));
}

INSTANTIATE_TEST_SUITE_P(Zero, DeviceModel,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16)),
                         ParamName);

// ---- offload ---------------------------------------------------------------------

TEST(ZeroDeviceOffload, FreesDeviceMomentsAndContinuesIdentically) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      const std::string what = "stage " + std::to_string(stage) + (precision == Precision::kBf16 ? " bf16" : " fp32");
      const auto plain = TrainSynthetic(true, 2, stage, precision, false);
      const auto offloaded = TrainSynthetic(true, 2, stage, precision, true);
      ExpectSameRecords(plain, offloaded, what);
    }
  }
  // What offload does to the device memory and the report.
  RunRanks(2, true, [&](Backend& b) {
    auto opt = ZeroOptimizer::Create(OptionsFor(b, 1, Precision::kFp32, OddUnits()));
    ASSERT_TRUE(opt.ok());
    ZeroOptimizer& z = **opt;
    ASSERT_TRUE(z.InitFromFull(InitFull(z.num_params()).data()).ok());
    double loss = 0;
    SyntheticPass(z, 0, 0, b.comm->rank(), &loss);
    ASSERT_TRUE(z.Step(1e-2f, 0.f).ok());
    std::vector<float> m0(z.shard_size()), v0(z.shard_size());
    z.CopyOptimizerShard(m0.data(), v0.data());
    const MemoryReport before = z.memory();
    const size_t device_before = b.memory->allocated_bytes();
    ASSERT_GT(before.optimizer_bytes, 0u);
    ASSERT_TRUE(z.OffloadOptimizerState().ok());
    EXPECT_TRUE(z.optimizer_offloaded());
    const MemoryReport off = z.memory();
    EXPECT_EQ(off.optimizer_bytes, 0u);
    EXPECT_EQ(off.offloaded_bytes, before.optimizer_bytes);
    EXPECT_EQ(off.total(), before.total() - before.optimizer_bytes);
    EXPECT_EQ(b.memory->allocated_bytes(), device_before - before.optimizer_bytes);
    // Checkpoint access reads the host copies; Step refuses.
    std::vector<float> m1(z.shard_size()), v1(z.shard_size());
    z.CopyOptimizerShard(m1.data(), v1.data());
    EXPECT_TRUE(SameBits(m0, m1));
    EXPECT_TRUE(SameBits(v0, v1));
    auto refused = z.Step(1e-2f, 0.f);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(z.RestoreOptimizerState().ok());
    EXPECT_FALSE(z.optimizer_offloaded());
    ExpectSameMemory(z.memory(), before, "after restore");
    EXPECT_EQ(b.memory->allocated_bytes(), device_before);
    z.CopyOptimizerShard(m1.data(), v1.data());
    EXPECT_TRUE(SameBits(m0, m1));
    EXPECT_TRUE(SameBits(v0, v1));
  });
}

// ---- allocation failures ----------------------------------------------------------

TEST(ZeroDeviceErrors, FailedAllocationIsResourceExhaustedWithBytes) {
  comm::InMemoryStore store;
  comm::CollectiveOptions co;
  auto c = comm::MakeCollective("gloo", store, 0, 1, co);
  ASSERT_TRUE(c.ok());
  auto mem = kernels::MakeGuardedMemory(size_t{1} << 20);  // 1 MiB
  auto ops = kernels::MakeGuardedOps(kernels::MakeCpuOps(1), mem.get());
  auto gc = comm::MakeGuardedCollective(std::move(*c), mem.get());
  ZeroOptions o;
  o.stage = 0;
  o.units = {{0, 200000}, {200000, 100000}};  // 1.2 MB of parameters
  o.comm = gc.get();
  o.ops = ops.get();
  o.memory = mem.get();
  auto opt = ZeroOptimizer::Create(o);
  ASSERT_FALSE(opt.ok());
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(opt.status().message().find("1200000 bytes"), std::string::npos) << opt.status();
  std::printf("%s\n", opt.status().ToString().c_str());
  EXPECT_EQ(mem->allocated_bytes(), 0u) << "nothing leaks";
}

}  // namespace
}  // namespace tandem::zero
