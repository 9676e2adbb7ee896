#include "bench/model/rollout_cases.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "worker/model/model.h"
#include "worker/rollout/engine.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

struct Weights {
  Weights(const model::ModelConfig& c, kernels::Ops* ops) : layout(c) {
    model::Model m(c, ops);
    params.resize(layout.total_floats());
    m.InitParams(1, params.data());
    pp = std::make_unique<model::FlatParamProvider>(layout, params.data(), nullptr);
  }
  model::ParamLayout layout;
  std::vector<float> params;
  std::unique_ptr<model::FlatParamProvider> pp;
};

struct Figure {
  double tokens_per_s = 0;
  double kv_bytes = 0;
};

void Print(const char* name, const char* who, const std::vector<Figure>& runs) {
  double lo = 1e30, hi = 0;
  for (const auto& f : runs) {
    lo = std::min(lo, f.tokens_per_s);
    hi = std::max(hi, f.tokens_per_s);
  }
  std::printf("%-7s %-34s %9.0f - %9.0f tokens/s   KV cache peak %7.1f MB\n", name, who, lo, hi,
              runs.back().kv_bytes / 1e6);
}

// The static-batch baseline: the whole batch admitted at once (one prefill
// of every prompt, no sharing), nothing admitted until it drains.
rollout::RolloutOptions StaticBatch(const rollout::RolloutOptions& o,
                                    const std::vector<rollout::RolloutRequest>& reqs) {
  rollout::RolloutOptions s = o;
  s.static_batch = true;
  s.share_prompts = false;
  s.max_seqs = static_cast<int>(reqs.size());
  int total = 0;
  for (const auto& r : reqs) total += static_cast<int>(r.prompt.size());
  s.max_batch_tokens = std::max(total, s.max_batch_tokens);
  return s;
}

}  // namespace

void DecodeCase(const model::ModelConfig& cfg_in, kernels::Ops* ops, int repeats) {
  model::ModelConfig cfg = cfg_in;
  cfg.eos_token_ids = {};  // always the full 128 tokens
  Weights w(cfg, ops);
  std::mt19937 rng(0);
  std::vector<std::vector<int32_t>> prompts(16, std::vector<int32_t>(128));
  for (auto& p : prompts) {
    for (auto& t : p) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  rollout::RolloutEngine eng(cfg, ops);
  rollout::RolloutOptions ro;
  ro.sampling.greedy = true;
  ro.max_new_tokens = 128;
  std::vector<rollout::RolloutRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) reqs.push_back({prompts[i], -1, i});
  const rollout::RolloutOptions so = StaticBatch(ro, reqs);
  (void)eng.Generate(reqs, so, *w.pp);  // warm-up
  (void)eng.Generate(reqs, ro, *w.pp);
  std::vector<Figure> old_runs, new_runs;
  for (int r = 0; r < repeats; ++r) {  // interleaved, so load hits both alike
    auto t0 = Clock::now();
    auto a = eng.Generate(reqs, so, *w.pp);
    const double ta = Secs(t0);
    eng.Release();
    t0 = Clock::now();
    auto b = eng.Generate(reqs, ro, *w.pp);
    const double tb = Secs(t0);
    eng.Release();
    if (!a.ok() || !b.ok()) {
      std::printf("decode failed\n");
      return;
    }
    old_runs.push_back({a->generated_tokens / ta, static_cast<double>(a->kv_peak_bytes)});
    new_runs.push_back({b->generated_tokens / tb, static_cast<double>(b->kv_peak_bytes)});
  }
  Print("decode", "engine, static batch", old_runs);
  Print("decode", "rollout engine", new_runs);
}

void GrpoCase(const model::ModelConfig& cfg_in, kernels::Ops* ops, int repeats, const std::string& table_out) {
  model::ModelConfig cfg = cfg_in;
  cfg.eos_token_ids = {};
  Weights w(cfg, ops);
  constexpr int kPrompts = 64, kG = 8, kCap = 256;
  std::mt19937_64 rng(7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lengths;
  std::geometric_distribution<int> geo(1.0 / 64);
  std::uniform_int_distribution<int> plen(32, 256);
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<int32_t> ids(plen(rng));
    for (auto& t : ids) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    for (int g = 0; g < kG; ++g) {
      prompts.push_back(ids);
      lengths.push_back(std::min(kCap, 1 + geo(rng)));
    }
  }
  if (!table_out.empty()) {
    std::ofstream f(table_out);
    f << "{\"group_size\": " << kG << ", \"prompt_lengths\": [";
    for (int p = 0; p < kPrompts; ++p) f << (p ? ", " : "") << prompts[p * kG].size();
    f << "], \"response_lengths\": [";
    for (size_t i = 0; i < lengths.size(); ++i) f << (i ? ", " : "") << lengths[i];
    f << "]}\n";
  }
  int64_t want = 0;
  for (int l : lengths) want += l;
  std::vector<int> count(prompts.size());
  auto stop = [&](size_t i, int32_t) { return ++count[i] >= lengths[i]; };

  rollout::RolloutEngine eng(cfg, ops);
  rollout::RolloutOptions ro;
  ro.max_new_tokens = kCap;
  ro.stop_check = stop;
  std::vector<rollout::RolloutRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    reqs.push_back({prompts[i], static_cast<int>(i / kG), i});
  }
  const rollout::RolloutOptions so = StaticBatch(ro, reqs);
  std::vector<Figure> old_runs, new_runs;
  int64_t saved = 0, preempt = 0;
  for (int r = 0; r < repeats; ++r) {
    std::fill(count.begin(), count.end(), 0);
    auto t0 = Clock::now();
    auto a = eng.Generate(reqs, so, *w.pp);
    const double ta = Secs(t0);
    eng.Release();
    std::fill(count.begin(), count.end(), 0);
    t0 = Clock::now();
    auto b = eng.Generate(reqs, ro, *w.pp);
    const double tb = Secs(t0);
    eng.Release();
    if (!a.ok() || !b.ok() || a->generated_tokens != want || b->generated_tokens != want) {
      std::printf("grpo rollout failed or lengths not forced\n");
      return;
    }
    old_runs.push_back({want / ta, static_cast<double>(a->kv_peak_bytes)});
    new_runs.push_back({want / tb, static_cast<double>(b->kv_peak_bytes)});
    saved = b->scheduler.prompt_tokens_saved;
    preempt = b->scheduler.preemptions;
  }
  std::printf(
      "grpo    64 prompts x G=8, %lld response tokens, prompt tokens saved by sharing %lld, "
      "preemptions %lld\n",
      static_cast<long long>(want), static_cast<long long>(saved), static_cast<long long>(preempt));
  Print("grpo", "engine, static batch", old_runs);
  Print("grpo", "rollout engine", new_runs);
}

}  // namespace tandem::bench
