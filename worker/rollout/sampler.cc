#include "worker/rollout/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::rollout {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

absl::Status ValidateSampling(const SamplingParams& p) {
  if (!p.greedy && !(p.temperature > 0.f)) {
    return absl::InvalidArgumentError("rollout: temperature must be > 0 (or greedy)");
  }
  if (p.top_k < 0) return absl::InvalidArgumentError("rollout: top_k must be >= 0");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return absl::InvalidArgumentError("rollout: top_p must be in (0, 1]");
  }
  if (!(p.min_p >= 0.f && p.min_p < 1.f)) {
    return absl::InvalidArgumentError("rollout: min_p must be in [0, 1)");
  }
  if (!(p.repetition_penalty > 0.f)) {
    return absl::InvalidArgumentError("rollout: repetition_penalty must be > 0");
  }
  return absl::OkStatus();
}

bool DeviceSamplable(const SamplingParams& p, int vocab) {
  if (p.repetition_penalty != 1.f) return false;
  if (p.greedy) return true;
  return (p.top_k <= 0 || p.top_k >= vocab) && p.top_p >= 1.f && p.min_p <= 0.f;
}

double StreamUniform(uint64_t seed, uint64_t stream, uint64_t token_index) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ (token_index * 0xd1342543de82ef95ull + 1));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

Pick HostSampler::Sample(const float* logits, int v, const SamplingParams& o, double u, std::span<const int32_t> seen) {
  // Raw log-softmax normaliser (temperature 1, no penalty).
  double mx = -INFINITY;
  for (int i = 0; i < v; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);

  const float* z = logits;
  if (o.repetition_penalty != 1.f && !seen.empty()) {
    work_.assign(logits, logits + v);
    for (int32_t t : seen) {
      if (t < 0 || t >= v) continue;
      const float x = logits[t];
      work_[t] = x > 0 ? x / o.repetition_penalty : x * o.repetition_penalty;
    }
    z = work_.data();
  }
  int32_t arg = 0;
  for (int i = 1; i < v; ++i) {
    if (z[i] > z[arg]) arg = i;
  }
  if (o.greedy) return {arg, 0.f, static_cast<float>(logits[arg] - lse)};

  const double inv_t = 1.0 / o.temperature;
  idx_.resize(v);
  std::iota(idx_.begin(), idx_.end(), 0);
  auto desc = [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  int n = v;
  if (o.top_k > 0 && o.top_k < v) {
    std::partial_sort(idx_.begin(), idx_.begin() + o.top_k, idx_.end(), desc);
    n = o.top_k;
  } else {
    std::sort(idx_.begin(), idx_.end(), desc);
  }
  prob_.resize(n);
  const double zmax = z[arg] * inv_t;
  double total = 0;
  for (int i = 0; i < n; ++i) {
    prob_[i] = std::exp(z[idx_[i]] * inv_t - zmax);
    total += prob_[i];
  }
  if (o.top_p < 1.f) {
    double cum = 0;
    int keep = 0;
    while (keep < n) {
      cum += prob_[keep] / total;
      ++keep;
      if (cum >= o.top_p) break;
    }
    n = keep;
  }
  if (o.min_p > 0.f) {
    // prob_[0] is the largest (the argmax is always first).
    const double floor = o.min_p * prob_[0];
    int keep = 1;
    while (keep < n && prob_[keep] >= floor) ++keep;
    n = keep;
  }
  total = 0;
  for (int i = 0; i < n; ++i) total += prob_[i];
  const double target = u * total;
  double acc = 0;
  int chosen = n - 1;
  for (int i = 0; i < n; ++i) {
    acc += prob_[i];
    if (target < acc) {
      chosen = i;
      break;
    }
  }
  const int32_t tok = idx_[chosen];
  return {tok, static_cast<float>(std::log(prob_[chosen] / total)), static_cast<float>(logits[tok] - lse)};
}

}  // namespace tandem::rollout
