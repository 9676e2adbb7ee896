// The sampling rule of Ops::sample_logits for one row, on the host (the
// reference and CPU backends, and generation's host sampler for the cases
// without top-k / top-p, so every host path draws the same tokens):
//   mx = max logit (first index on ties), lse = mx + log(sum exp(l - mx))
//   greedy (temperature <= 0): id = argmax, logp_sample = 0
//   else: p_i = exp(l_i / T - mx / T) summed in vocabulary order to z;
//         id = first i with u * z < p_0 + ... + p_i (the last id if rounding
//         leaves none), logp_sample = log(p_id / z)
//   logp_raw = l_id - lse
// Sums are in double. The CUDA kernel sums in another order, so a draw that
// falls within rounding of a boundary may pick the neighbouring token.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

struct SampledToken {
  int32_t id = 0;
  float logp_sample = 0.f;
  float logp_raw = 0.f;
};

inline SampledToken SampleRow(const float* logits, int v, float temperature, double u) {
  double mx = -INFINITY;
  int32_t arg = 0;
  for (int i = 0; i < v; ++i) {
    if (logits[i] > mx) {
      mx = logits[i];
      arg = i;
    }
  }
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (!(temperature > 0.f)) return {arg, 0.f, static_cast<float>(logits[arg] - lse)};
  const double inv_t = 1.0 / temperature;
  const double zmax = mx * inv_t;  // the argmax is always a candidate
  double z = 0;
  for (int i = 0; i < v; ++i) z += std::exp(logits[i] * inv_t - zmax);
  const double target = u * z;
  double acc = 0;
  int32_t chosen = v - 1;
  double p_chosen = std::exp(logits[v - 1] * inv_t - zmax);
  for (int i = 0; i < v; ++i) {
    const double p = std::exp(logits[i] * inv_t - zmax);
    acc += p;
    if (target < acc) {
      chosen = i;
      p_chosen = p;
      break;
    }
  }
  return {chosen, static_cast<float>(std::log(p_chosen / z)), static_cast<float>(logits[chosen] - lse)};
}

// Row r of Ops::sample_logits' arguments: samples it and writes the outputs.
inline void SampleRowAt(const float* logits, int r, int v, float temperature, const double* uniforms, int32_t* ids,
                        float* logp_sample, float* logp_raw) {
  const SampledToken t = SampleRow(logits + static_cast<size_t>(r) * v, v, temperature, uniforms[r]);
  ids[r] = t.id;
  logp_sample[r] = t.logp_sample;
  logp_raw[r] = t.logp_raw;
}

}  // namespace tandem::kernels
