// GRPO / PPO-clip math: group-normalised advantages and the per-token policy
// loss with its gradient with respect to the new log-probs.
//
// Advantages (GRPO, Shao et al. 2024): A_i = (r_i - mean_g) / (std_g + eps)
// over each group g of group_size consecutive rewards, or r_i - mean_g when
// scale_by_std is false (Dr. GRPO). std_g is the unbiased (Bessel-corrected)
// standard deviation by default, as TRL's GRPOTrainer computes it with
// torch.Tensor.std(); the population std is an option. A group of one has
// std 0 (advantage 0).
//
// Policy loss per masked token t (r_t = exp(logp_new - logp_old)):
//   pg_t = -min(r_t A_t, clip(r_t, 1 - clip_low, 1 + clip_high) A_t)
//   kl_t = exp(logp_ref - logp_new) - (logp_ref - logp_new) - 1   (k3)
//   l_t  = pg_t + kl_coef * kl_t
// Aggregation:
//   token:    loss = sum_t mask_t l_t / normaliser   (normaliser defaults to
//             the number of masked tokens here; pass the GLOBAL count of the
//             mini-batch so that every world size gives the same gradient)
//   sequence: loss = sum_s (sum_{t in s} mask_t l_t / n_s) / normaliser with
//             n_s the masked tokens of sequence s (normaliser defaults to the
//             number of sequences with n_s > 0; pass the global count).
// dlogp[t] = d loss / d logp_new[t] (0 where mask is 0).
// All arithmetic is done in double; T (float or double) is the storage type.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::rl {

struct AdvantageOptions {
  int group_size = 1;
  bool scale_by_std = true;
  bool unbiased_std = true;  // Bessel's correction (TRL); false: population
  double eps = 1e-4;         // TRL's value
};

// rewards.size() must be a multiple of group_size (consecutive groups).
absl::StatusOr<std::vector<double>> GroupAdvantages(std::span<const double> rewards, const AdvantageOptions& options);

enum class LossAggregation { kToken, kSequence };

struct PolicyLossOptions {
  double clip_low = 0.2;   // epsilon below 1
  double clip_high = 0.2;  // epsilon above 1 (asymmetric clip, DAPO)
  double kl_coef = 0.0;    // 0: logp_ref may be empty
  LossAggregation aggregation = LossAggregation::kToken;
};

template <typename T>
struct PolicyLossInput {
  std::span<const T> logp_new{};    // per token
  std::span<const T> logp_old{};    // per token (rollout / behaviour policy)
  std::span<const T> logp_ref{};    // per token; may be empty when kl_coef == 0
  std::span<const T> advantages{};  // per token (sequence value broadcast)
  std::span<const T> mask{};        // per token, 0 or 1 (weights allowed)
  // Sequence boundaries [0, ..., num_tokens]; needed for kSequence only.
  std::span<const int32_t> cu_seqlens{};
};

template <typename T>
struct PolicyLossResult {
  double loss = 0;       // aggregated as documented above
  std::vector<T> dlogp;  // d loss / d logp_new, per token
  // Local sums so callers can combine ranks exactly:
  double masked_tokens = 0;  // sum of mask
  double kl_sum = 0;         // sum mask * kl_t
  double clipped_sum = 0;    // sum mask * [clipped branch active]
  double ratio_sum = 0;      // sum mask * r_t
  double sequences = 0;      // sequences with at least one masked token
  // Local means over masked tokens (0 when there are none).
  double kl_mean = 0;
  double clip_fraction = 0;
  double ratio_mean = 0;
};

// normaliser <= 0 means "use the local default" (see above).
template <typename T>
absl::StatusOr<PolicyLossResult<T>> PolicyLoss(const PolicyLossInput<T>& in, const PolicyLossOptions& options,
                                               double normaliser = 0);

extern template absl::StatusOr<PolicyLossResult<float>> PolicyLoss(const PolicyLossInput<float>&,
                                                                   const PolicyLossOptions&, double);
extern template absl::StatusOr<PolicyLossResult<double>> PolicyLoss(const PolicyLossInput<double>&,
                                                                    const PolicyLossOptions&, double);

}  // namespace tandem::rl
