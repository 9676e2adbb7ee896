// The sampling rule of Ops::sample_filtered for one row, on the host: the
// plain reference that the reference and CPU backends run, that rollout's
// host sampler runs, and that the CUDA kernel (cuda/sample_filter_kernel.cuh)
// reproduces with threshold searches instead of a sort.
//   lse = mx + log(sum exp(l - mx)) over the raw logits (mx their max)
//   z_i = l_i, or for a seen id: l_i / penalty when l_i > 0, else
//         l_i * penalty (float arithmetic; a repeated id counts once)
//   order: z descending, ties by lowest id; arg = the first of that order
//   greedy (temperature <= 0): id = arg, logp_sample = 0
//   p_i = exp(z_i * (1 / T) - z_arg * (1 / T)) in double (p_arg = 1)
//   top-k (0 < k < V): keep the first k of the order
//   top-p (< 1): keep the shortest prefix whose running sum of p_i / total
//         reaches top_p (total = the sum over the kept tokens)
//   min-p (> 0): then keep the prefix of tokens with p_i >= min_p (the
//         floor is relative to the largest probability, p_arg = 1)
//   draw: total = sum of the kept p_i (in order); id = the first kept token
//         with u * total < running sum (the last kept one if rounding leaves
//         none); logp_sample = log(p_id / total)
//   logp_raw = l_id - lse
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/ops.h"
#include "kernels/sample_row.h"

namespace tandem::kernels {

// Buffers of SampleFilteredRow, grown once to the vocabulary.
struct SampleFilterScratch {
  std::vector<float> work;
  std::vector<int32_t> idx;
  std::vector<double> prob;
};

inline SampledToken SampleFilteredRow(const float* logits, int v, const SampleFilter& f, double u, const int32_t* seen,
                                      size_t num_seen, SampleFilterScratch& s) {
  double mx = -INFINITY;
  for (int i = 0; i < v; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);

  const float* z = logits;
  if (f.repetition_penalty != 1.f && num_seen > 0) {
    s.work.assign(logits, logits + v);
    for (size_t j = 0; j < num_seen; ++j) {
      const int32_t t = seen[j];
      if (t < 0 || t >= v) continue;
      const float x = logits[t];
      s.work[t] = x > 0 ? x / f.repetition_penalty : x * f.repetition_penalty;
    }
    z = s.work.data();
  }
  int32_t arg = 0;
  for (int i = 1; i < v; ++i) {
    if (z[i] > z[arg]) arg = i;
  }
  if (!(f.temperature > 0.f)) return {arg, 0.f, static_cast<float>(logits[arg] - lse)};

  const double inv_t = 1.0 / f.temperature;
  s.idx.resize(v);
  std::iota(s.idx.begin(), s.idx.end(), 0);
  auto desc = [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
  int n = v;
  if (f.top_k > 0 && f.top_k < v) {
    std::partial_sort(s.idx.begin(), s.idx.begin() + f.top_k, s.idx.end(), desc);
    n = f.top_k;
  } else {
    std::sort(s.idx.begin(), s.idx.end(), desc);
  }
  s.prob.resize(n);
  const double zmax = z[arg] * inv_t;
  double total = 0;
  for (int i = 0; i < n; ++i) {
    s.prob[i] = std::exp(z[s.idx[i]] * inv_t - zmax);
    total += s.prob[i];
  }
  if (f.top_p < 1.f) {
    double cum = 0;
    int keep = 0;
    while (keep < n) {
      cum += s.prob[keep] / total;
      ++keep;
      if (cum >= f.top_p) break;
    }
    n = keep;
  }
  if (f.min_p > 0.f) {
    const double floor = f.min_p * s.prob[0];  // prob[0] = p_arg = 1
    int keep = 1;
    while (keep < n && s.prob[keep] >= floor) ++keep;
    n = keep;
  }
  total = 0;
  for (int i = 0; i < n; ++i) total += s.prob[i];
  const double target = u * total;
  double acc = 0;
  int chosen = n - 1;
  for (int i = 0; i < n; ++i) {
    acc += s.prob[i];
    if (target < acc) {
      chosen = i;
      break;
    }
  }
  const int32_t tok = s.idx[chosen];
  return {tok, static_cast<float>(std::log(s.prob[chosen] / total)), static_cast<float>(logits[tok] - lse)};
}

// Row r of Ops::sample_filtered's arguments (host pointers): samples it and
// writes the outputs.
inline void SampleFilteredRowAt(const float* logits, int r, int v, const SampleFilter& f, const int32_t* seen_offsets,
                                const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                                float* logp_raw, SampleFilterScratch& s) {
  const int32_t* row_seen = nullptr;
  size_t num_seen = 0;
  if (seen_offsets != nullptr && seen != nullptr) {
    row_seen = seen + seen_offsets[r];
    num_seen = static_cast<size_t>(seen_offsets[r + 1] - seen_offsets[r]);
  }
  const SampledToken t =
      SampleFilteredRow(logits + static_cast<size_t>(r) * v, v, f, uniforms[r], row_seen, num_seen, s);
  ids[r] = t.id;
  logp_sample[r] = t.logp_sample;
  logp_raw[r] = t.logp_raw;
}

}  // namespace tandem::kernels
