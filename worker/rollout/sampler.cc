#include "worker/rollout/sampler.h"

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

bool UsesFilters(const SamplingParams& p, int vocab) {
  if (p.repetition_penalty != 1.f) return true;
  if (p.greedy) return false;
  return (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.f || p.min_p > 0.f;
}

kernels::SampleFilter ToSampleFilter(const SamplingParams& p) {
  kernels::SampleFilter f;
  f.temperature = p.greedy ? 0.f : p.temperature;
  f.top_k = p.top_k;
  f.top_p = p.top_p;
  f.min_p = p.min_p;
  f.repetition_penalty = p.repetition_penalty;
  return f;
}

double StreamUniform(uint64_t seed, uint64_t stream, uint64_t token_index) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ (token_index * 0xd1342543de82ef95ull + 1));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

Pick HostSampler::Sample(const float* logits, int v, const SamplingParams& o, double u, std::span<const int32_t> seen) {
  const kernels::SampledToken t =
      kernels::SampleFilteredRow(logits, v, ToSampleFilter(o), u, seen.data(), seen.size(), scratch_);
  return {t.id, t.logp_sample, t.logp_raw};
}

}  // namespace tandem::rollout
