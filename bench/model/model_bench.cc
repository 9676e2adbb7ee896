// bench_model: tokens/s of a full training step (forward + backward + AdamW)
// for configs A and B, and of batched KV-cache decoding for config A, with
// model FLOP/s as a fraction of the measured sgemm ceiling.
//
//   build/bin/bench_model [--threads 2] [--iters 5] [--only train|decode|grpo|mecefo]
//                         [--grpo-table FILE]
//
// decode: the rollout engine in its static-batch mode and with continuous
// batching (greedy, batch 16, prompt 128, 128 new tokens); grpo: a
// GRPO-shaped rollout with both (bench/model/rollout_cases.h); --grpo-table writes its length table for
// bench/pytorch/llama_peer.py.
//
// mecefo: forward + backward of one micro-batch in each of MeCeFO's modes
// for a taken-over share (exact, no attention backward, + MLP
// recomputation, + low-rank MLP gradients), against the exact one: the
// extra work of a survivor that computes its own share and a lost one's.
//
// Compare with bench/pytorch/llama_peer.py on the same machine (see
// docs/benchmarks.md for the exact commands and figures).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/matmul_cpu.h"

#include "bench/model/rollout_cases.h"
#include "kernels/backends.h"
#include "worker/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
using tandem::model::ModelConfig;

struct Shape {
  const char* name;
  int vocab, hidden, layers, heads, kv_heads, inter, batch, seq;
};
constexpr Shape kA = {"A", 512, 256, 4, 8, 2, 688, 8, 256};
constexpr Shape kB = {"B", 4096, 512, 8, 8, 4, 1376, 4, 512};

// The benchmark's micro-batch: s.batch sequences of s.seq + 1 random tokens
// (seed 0, so every mode sees the same one).
tandem::model::Batch RandomBatch(const Shape& s) {
  std::mt19937 rng(0);
  tandem::model::Batch batch;
  for (int b = 0; b < s.batch; ++b) {
    std::vector<int32_t> seq(s.seq + 1);
    for (auto& t : seq) t = static_cast<int32_t>(rng() % s.vocab);
    batch.AddSequence(seq);
  }
  return batch;
}

ModelConfig ToConfig(const Shape& s) {
  ModelConfig c;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.max_position_embeddings = 4096;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

double Secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// Measured sgemm ceiling (n = 1024), GFLOP/s.
double SgemmCeiling() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  tandem::kernels::cpu::matmul(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t = Clock::now();
    tandem::kernels::cpu::matmul(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best, Secs(t));
  }
  return 2.0 * n * n * n / best / 1e9;
}

void Train(const Shape& s, tandem::kernels::Ops* ops, int iters, double ceiling) {
  ModelConfig cfg = ToConfig(s);
  tandem::model::Model model(cfg, ops);
  const auto& layout = model.layout();
  std::vector<float> params(layout.total_floats()), grads(layout.total_floats(), 0.f), m(layout.total_floats(), 0.f),
      v(layout.total_floats(), 0.f);
  model.InitParams(1, params.data());
  tandem::model::FlatParamProvider pp(layout, params.data(), grads.data());
  tandem::model::Batch batch = RandomBatch(s);
  const int T = batch.num_tokens();
  std::vector<float> logp(T), mask(T, 1.f), dlogp(T);
  std::vector<double> times;
  for (int it = 0; it < iters + 2; ++it) {
    auto t0 = Clock::now();
    std::fill(grads.begin(), grads.end(), 0.f);
    (void)model.ForwardLogprobs(batch, pp, logp.data());
    tandem::model::SftLoss(logp, mask, dlogp.data());
    (void)model.Backward(dlogp.data(), pp);
    ops->adamw_step(params.data(), grads.data(), m.data(), v.data(), params.size(), 1e-4f, 0.9f, 0.999f, 1e-8f, 0.f,
                    it + 1);
    if (it >= 2) times.push_back(Secs(t0));
  }
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  const double n_params = static_cast<double>(tandem::model::ParameterCount(cfg));
  // 6 N per token for the matmuls plus causal attention: fwd 2*2*T*D*H/2 per
  // token per layer (QK^T and PV, half masked), x3 for fwd+bwd.
  const double attn = 3.0 * 2.0 * s.seq * s.hidden * s.layers;
  const double flops = (6.0 * n_params + attn) * T;
  std::printf(
      "train  %-2s  params %9.0f  tokens/step %6d  step %8.1f ms  %9.0f tokens/s  "
      "%6.1f GFLOP/s  %4.0f%% of sgemm ceiling\n",
      s.name, n_params, T, t * 1e3, T / t, flops / t / 1e9, 100.0 * flops / t / 1e9 / ceiling);
}

// Forward + backward of one micro-batch in each mode, one model per mode,
// the modes interleaved round by round (so that load on the machine hits
// them alike); medians.
void MeCeFO(const Shape& s, tandem::kernels::Ops* ops, int iters) {
  struct Mode {
    const char* name;
    bool skip, recompute;
    int low_rank;
  };
  const int r = s.hidden / 8;
  const Mode modes[] = {{"exact", false, false, 0},
                        {"skip attention backward", true, false, 0},
                        {"+ MLP recomputation", true, true, 0},
                        {"+ low-rank MLP gradients", true, true, r}};
  constexpr int kModes = 4;
  ModelConfig cfg = ToConfig(s);
  std::vector<std::unique_ptr<tandem::model::Model>> models;
  for (int i = 0; i < kModes; ++i) models.push_back(std::make_unique<tandem::model::Model>(cfg, ops));
  const auto& layout = models[0]->layout();
  std::vector<float> params(layout.total_floats()), grads(layout.total_floats(), 0.f);
  models[0]->InitParams(1, params.data());
  tandem::model::FlatParamProvider pp(layout, params.data(), grads.data());
  tandem::model::Batch batch = RandomBatch(s);
  const int T = batch.num_tokens();
  std::vector<float> logp(T), mask(T, 1.f), dlogp(T);
  std::vector<std::vector<double>> times(kModes);
  for (int it = 0; it < iters + 2; ++it) {
    for (int i = 0; i < kModes; ++i) {
      tandem::model::ForwardOptions fo;
      fo.recompute_mlp = modes[i].recompute;
      tandem::model::BackwardOptions bo;
      bo.skip_attention = modes[i].skip;
      bo.low_rank = modes[i].low_rank;
      bo.low_rank_seed = static_cast<uint64_t>(it);
      auto t0 = Clock::now();
      (void)models[i]->ForwardLogprobs(batch, pp, logp.data(), nullptr, fo);
      tandem::model::SftLoss(logp, mask, dlogp.data());
      (void)models[i]->Backward(dlogp.data(), pp, bo);
      if (it >= 2) times[i].push_back(Secs(t0));
    }
  }
  std::vector<double> med(kModes);
  for (int i = 0; i < kModes; ++i) {
    std::sort(times[i].begin(), times[i].end());
    med[i] = times[i][times[i].size() / 2];
  }
  for (int i = 0; i < kModes; ++i) {
    std::printf(
        "mecefo %-2s  %d x %d tokens  %-26s rank %3d  fwd+bwd %7.1f ms (%5.1f%% of exact)  "
        "workspace %6.1f MB\n",
        s.name, s.batch, s.seq, modes[i].name, modes[i].low_rank, med[i] * 1e3, 100.0 * med[i] / med[0],
        models[i]->workspace_bytes() / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 5;
  std::string only = "all", grpo_table;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_model [--threads N] [--iters N] [--only train|decode|grpo|mecefo] [--grpo-table FILE]\n");
      return 0;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--grpo-table" && i + 1 < argc) {
      grpo_table = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "bench_model: unknown argument %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  auto ops = tandem::kernels::MakeCpuOps(threads);
  const double ceiling = SgemmCeiling();
  std::printf("bench_model: %d threads, sgemm ceiling %.0f GFLOP/s (n=1024)\n", threads, ceiling);
  if (only == "all" || only == "train") {
    Train(kA, ops.get(), iters, ceiling);
    Train(kB, ops.get(), iters, ceiling);
  }
  if (only == "all" || only == "decode") tandem::bench::DecodeCase(ToConfig(kA), ops.get(), iters);
  if (only == "all" || only == "grpo") {
    tandem::bench::GrpoCase(ToConfig(kA), ops.get(), std::max(1, iters / 2), grpo_table);
  }
  if (only == "all" || only == "mecefo") {
    // The degraded benchmark's model (bench/recovery/sft-reverse.yaml: one
    // micro-batch of 8 sequences of ~50 tokens), then config A.
    constexpr Shape kReverse = {"R", 99, 256, 4, 4, 2, 768, 8, 50};
    MeCeFO(kReverse, ops.get(), iters);
    MeCeFO(kA, ops.get(), iters);
  }
  return 0;
}
