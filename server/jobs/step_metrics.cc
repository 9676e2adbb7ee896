#include "server/jobs/step_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::server {

using tandem::v1::StepMetrics;

void MergeMetrics(StepMetrics* acc, const StepMetrics& m) {
  if (m.loss() != 0) acc->set_loss(m.loss());
  if (m.reward_mean() != 0) acc->set_reward_mean(m.reward_mean());
  if (m.accuracy() != 0) acc->set_accuracy(m.accuracy());
  if (m.kl() != 0) acc->set_kl(m.kl());
  if (m.tokens_per_s() != 0) acc->set_tokens_per_s(m.tokens_per_s());
  if (m.lr() != 0) acc->set_lr(m.lr());
  if (m.grad_norm() != 0) acc->set_grad_norm(m.grad_norm());
  acc->set_switch_seconds(acc->switch_seconds() + m.switch_seconds());
  acc->set_peak_memory_bytes(std::max(acc->peak_memory_bytes(), m.peak_memory_bytes()));
  for (const auto& [k, val] : m.extra()) (*acc->mutable_extra())[k] = val;
  for (const auto& [k, val] : m.phase_seconds()) {
    if (!acc->phase_seconds().contains(k)) (*acc->mutable_phase_seconds())[k] = val;
  }
}

std::string StepSummary(const StepMetrics& m, int64_t total_steps) {
  std::string s = absl::StrCat("step ", m.step(), "/", total_steps);
  if (m.loss() != 0) absl::StrAppend(&s, absl::StrFormat(" loss %.4f", m.loss()));
  if (m.reward_mean() != 0) absl::StrAppend(&s, absl::StrFormat(" reward %.4f", m.reward_mean()));
  if (m.accuracy() != 0) absl::StrAppend(&s, absl::StrFormat(" accuracy %.3f", m.accuracy()));
  if (m.tokens_per_s() != 0) absl::StrAppend(&s, absl::StrFormat(" tokens/s %.0f", m.tokens_per_s()));
  return s;
}

void AddTierBytes(StepMetrics* acc, const StepMetrics& m) {
  for (const auto& [k, val] : m.extra()) {
    if (k.rfind("tier_sent_", 0) == 0) (*acc->mutable_extra())[absl::StrCat("job_", k)] += val;
  }
}

bool WarmStartHeld(const StepMetrics& m) {
  auto it = m.extra().find("warm_start_held");
  return it != m.extra().end() && it->second == 1;
}

std::string TeacherForcedExact(const StepMetrics& m) {
  auto it = m.extra().find("teacher_forced_exact");
  return it == m.extra().end() ? std::string("?") : absl::StrFormat("%.3f", it->second);
}

}  // namespace tandem::server
