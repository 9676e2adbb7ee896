// GRPO / PPO-clip math: see grpo.h.
#include "worker/rl/grpo.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::rl {

absl::StatusOr<std::vector<double>> GroupAdvantages(std::span<const double> rewards, const AdvantageOptions& o) {
  if (o.group_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rl.group_size must be >= 1, got ", o.group_size));
  }
  if (rewards.size() % o.group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(rewards.size(), " rewards do not split into groups of ", o.group_size));
  }
  if (!(o.eps >= 0) || !std::isfinite(o.eps)) {
    return absl::InvalidArgumentError("advantage eps must be finite and >= 0");
  }
  for (size_t i = 0; i < rewards.size(); ++i) {
    if (!std::isfinite(rewards[i])) {
      return absl::InvalidArgumentError(absl::StrCat("reward ", i, " is not finite (", rewards[i], ")"));
    }
  }
  std::vector<double> adv(rewards.size());
  const size_t g = static_cast<size_t>(o.group_size);
  for (size_t start = 0; start < rewards.size(); start += g) {
    double mean = 0;
    for (size_t i = 0; i < g; ++i) mean += rewards[start + i];
    mean /= static_cast<double>(g);
    double ss = 0;
    for (size_t i = 0; i < g; ++i) {
      const double d = rewards[start + i] - mean;
      ss += d * d;
    }
    double std = 0;
    if (g > 1) std = std::sqrt(ss / static_cast<double>(o.unbiased_std ? g - 1 : g));
    for (size_t i = 0; i < g; ++i) {
      const double d = rewards[start + i] - mean;
      adv[start + i] = o.scale_by_std ? d / (std + o.eps) : d;
    }
  }
  return adv;
}

template <typename T>
absl::StatusOr<PolicyLossResult<T>> PolicyLoss(const PolicyLossInput<T>& in, const PolicyLossOptions& o,
                                               double normaliser) {
  const size_t n = in.logp_new.size();
  if (in.logp_old.size() != n || in.advantages.size() != n || in.mask.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("policy loss inputs differ in length: logp_new ", n, ", logp_old ",
                                                   in.logp_old.size(), ", advantages ", in.advantages.size(), ", mask ",
                                                   in.mask.size()));
  }
  const bool have_ref = !in.logp_ref.empty();
  if (have_ref && in.logp_ref.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("logp_ref has ", in.logp_ref.size(), " entries, expected ", n));
  }
  if (o.kl_coef != 0 && !have_ref) {
    return absl::InvalidArgumentError("rl.kl_coef is not 0 but no reference log-probs were given");
  }
  if (!(o.clip_low >= 0 && o.clip_low < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("rl.clip must be in [0, 1), got ", o.clip_low));
  }
  if (!(o.clip_high >= 0) || !std::isfinite(o.clip_high)) {
    return absl::InvalidArgumentError(absl::StrCat("rl.clip_high must be finite and >= 0, got ", o.clip_high));
  }
  if (!(o.kl_coef >= 0) || !std::isfinite(o.kl_coef)) {
    return absl::InvalidArgumentError(absl::StrCat("rl.kl_coef must be finite and >= 0, got ", o.kl_coef));
  }
  if (!std::isfinite(normaliser)) {
    return absl::InvalidArgumentError("loss normaliser is not finite");
  }

  // Per-token weight w_t such that loss = sum_t w_t l_t.
  std::vector<double> weight(n, 0.0);
  PolicyLossResult<T> res;
  for (size_t t = 0; t < n; ++t) res.masked_tokens += in.mask[t];
  if (o.aggregation == LossAggregation::kToken) {
    const double norm = normaliser > 0 ? normaliser : res.masked_tokens;
    if (norm > 0) {
      for (size_t t = 0; t < n; ++t) weight[t] = in.mask[t] / norm;
    }
  } else {
    const auto& cu = in.cu_seqlens;
    if (cu.size() < 2 || cu.front() != 0 || static_cast<size_t>(cu.back()) != n) {
      return absl::InvalidArgumentError(absl::StrCat("sequence aggregation needs cu_seqlens from 0 to ", n));
    }
    std::vector<double> per_seq(cu.size() - 1, 0.0);
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
      if (cu[s + 1] < cu[s]) {
        return absl::InvalidArgumentError("cu_seqlens is not non-decreasing");
      }
      for (int32_t t = cu[s]; t < cu[s + 1]; ++t) per_seq[s] += in.mask[t];
      if (per_seq[s] > 0) res.sequences += 1;
    }
    const double norm = normaliser > 0 ? normaliser : res.sequences;
    if (norm > 0) {
      for (size_t s = 0; s + 1 < cu.size(); ++s) {
        if (per_seq[s] <= 0) continue;
        for (int32_t t = cu[s]; t < cu[s + 1]; ++t) {
          weight[t] = in.mask[t] / (per_seq[s] * norm);
        }
      }
    }
  }

  res.dlogp.assign(n, T(0));
  const double lo = 1.0 - o.clip_low;
  const double hi = 1.0 + o.clip_high;
  double loss = 0;
  for (size_t t = 0; t < n; ++t) {
    const double m = in.mask[t];
    if (m == 0) continue;
    const double lnew = in.logp_new[t];
    const double ratio = std::exp(lnew - static_cast<double>(in.logp_old[t]));
    const double a = in.advantages[t];
    const double clipped = std::min(std::max(ratio, lo), hi);
    const double unclipped_obj = ratio * a;
    const double clipped_obj = clipped * a;
    // The unclipped branch carries the gradient unless clipping lowered the
    // objective (TRL's is_clipped condition).
    const bool is_clipped = (ratio < lo && a < 0) || (ratio > hi && a > 0);
    double l = -std::min(unclipped_obj, clipped_obj);
    double dl = is_clipped ? 0.0 : -unclipped_obj;
    if (have_ref) {
      const double delta = static_cast<double>(in.logp_ref[t]) - lnew;
      const double e = std::exp(delta);
      const double kl = e - delta - 1.0;
      res.kl_sum += m * kl;
      l += o.kl_coef * kl;
      dl += o.kl_coef * (1.0 - e);
    }
    res.clipped_sum += m * (is_clipped ? 1.0 : 0.0);
    res.ratio_sum += m * ratio;
    loss += weight[t] * l;
    res.dlogp[t] = static_cast<T>(weight[t] * dl);
  }
  res.loss = loss;
  if (res.masked_tokens > 0) {
    res.kl_mean = res.kl_sum / res.masked_tokens;
    res.clip_fraction = res.clipped_sum / res.masked_tokens;
    res.ratio_mean = res.ratio_sum / res.masked_tokens;
  }
  return res;
}

template absl::StatusOr<PolicyLossResult<float>> PolicyLoss(const PolicyLossInput<float>&, const PolicyLossOptions&,
                                                            double);
template absl::StatusOr<PolicyLossResult<double>> PolicyLoss(const PolicyLossInput<double>&, const PolicyLossOptions&,
                                                             double);

}  // namespace tandem::rl
