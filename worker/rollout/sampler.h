// Token sampling for rollout.
//
// Rule (Hugging Face's order): repetition penalty (CTRL: a seen token's
// logit is divided by the penalty when positive, multiplied when negative;
// off at 1) -> temperature -> top-k -> top-p -> min-p (keep tokens whose
// probability is at least min_p times the largest) -> inverse CDF at one
// uniform, candidates in descending logit order (ties: lower id first).
// Greedy is the argmax (lowest id on ties).
//
// Randomness: the uniform of token i of stream s is a pure function of
// (seed, s, i) (counter-based, splitmix64). A GRPO rollout uses one seed per
// step and stream = prompt index * G + sample index, so every sample's
// tokens are the same whatever the batch composition, the world size or a
// preemption that recomputes the sequence.
//
// Each pick also returns the token's log-prob under the sampling
// distribution (0 when greedy) and under softmax(logits) at temperature 1
// (what RL compares with the trainer's log-probs).
//
// The engine samples on the backend's device: Ops::sample_logits when no
// filter is on (temperature or greedy; inverse CDF in vocabulary order),
// Ops::sample_filtered otherwise (the rule above, kernels/
// sample_filter_row.h). HostSampler runs the same rule on the host.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/ops.h"
#include "kernels/sample_filter_row.h"

namespace tandem::rollout {

struct SamplingParams {
  bool greedy = false;
  float temperature = 1.f;         // > 0 unless greedy
  int top_k = 0;                   // 0 = off
  float top_p = 1.f;               // (0, 1]; 1 = off
  float min_p = 0.f;               // [0, 1); 0 = off
  float repetition_penalty = 1.f;  // > 0; 1 = off
  uint64_t seed = 0;
};

absl::Status ValidateSampling(const SamplingParams& p);

// True when p turns on a filter (top-k below the vocabulary, top-p, min-p
// or the repetition penalty): such steps use Ops::sample_filtered.
bool UsesFilters(const SamplingParams& p, int vocab);

// The op's form of p (greedy: temperature 0).
kernels::SampleFilter ToSampleFilter(const SamplingParams& p);

double StreamUniform(uint64_t seed, uint64_t stream, uint64_t token_index);

struct Pick {
  int32_t token = 0;
  float logprob = 0.f;      // sampling distribution
  float raw_logprob = 0.f;  // softmax(logits), temperature 1
};

// Host sampling of one row with every filter (kernels::SampleFilteredRow,
// the reference of Ops::sample_filtered). `seen` are the tokens the
// repetition penalty applies to (prompt and generated). Scratch is reused
// across calls (grown once to the vocabulary).
class HostSampler {
 public:
  Pick Sample(const float* logits, int v, const SamplingParams& p, double u, std::span<const int32_t> seen);

 private:
  kernels::SampleFilterScratch scratch_;
};

}  // namespace tandem::rollout
