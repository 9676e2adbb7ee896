#include "server/jobs/phase_plan.h"

#include "absl/strings/ascii.h"

namespace tandem::server {

using tandem::v1::Phase;

PhasePlan::PhasePlan(const tandem::v1::JobSpec& spec)
    : kind_(spec.kind()),
      steps_(spec.train().steps()),
      eval_every_(spec.train().eval_every()),
      checkpoint_every_(spec.checkpoint().every()),
      disaggregated_(spec.placement().mode() == "disaggregated") {
  if (kind_ == tandem::v1::JOB_KIND_SFT) {
    first_step_unit_ = 1;
  } else {
    warmup_ = spec.init().sft_steps();
    first_step_unit_ = 1 + warmup_ + 1;  // setup, warm start, baseline
  }
  num_units_ = first_step_unit_ + steps_ + 2;  // + export, teardown
}

UnitKind PhasePlan::KindOf(int64_t unit) const {
  if (unit == 0) return UnitKind::kSetup;
  if (unit >= first_step_unit_ + steps_) {
    return unit == first_step_unit_ + steps_ ? UnitKind::kExport : UnitKind::kTeardown;
  }
  if (unit >= first_step_unit_) return UnitKind::kStep;
  if (unit <= warmup_) return UnitKind::kWarmup;
  return UnitKind::kBaseline;
}

int64_t PhasePlan::StepOf(int64_t unit) const {
  switch (KindOf(unit)) {
    case UnitKind::kWarmup:
      return -unit;
    case UnitKind::kStep:
      return unit - first_step_unit_ + 1;
    default:
      return 0;
  }
}

std::vector<PlannedPhase> PhasePlan::Unit(int64_t unit) const {
  std::vector<PlannedPhase> out;
  if (unit < 0 || unit >= num_units_) return out;
  const int64_t step = StepOf(unit);
  switch (KindOf(unit)) {
    case UnitKind::kSetup:
      out.push_back({tandem::v1::PHASE_SETUP, 0});
      break;
    case UnitKind::kWarmup:
      out.push_back({tandem::v1::PHASE_SFT_STEP, step, true});
      break;
    case UnitKind::kBaseline:
      out.push_back({tandem::v1::PHASE_EVAL, 0});
      break;
    case UnitKind::kExport:
      out.push_back({tandem::v1::PHASE_EXPORT, steps_});
      break;
    case UnitKind::kTeardown:
      out.push_back({tandem::v1::PHASE_TEARDOWN, steps_});
      break;
    case UnitKind::kStep: {
      if (kind_ == tandem::v1::JOB_KIND_SFT) {
        out.push_back({tandem::v1::PHASE_SFT_STEP, step});
      } else {
        // Disaggregated: the rollout ranks first pull the current weights
        // (covers the warm start, restores and recoveries too).
        if (disaggregated_) out.push_back({tandem::v1::PHASE_SYNC_WEIGHTS, step});
        for (Phase p : {tandem::v1::PHASE_ROLLOUT, tandem::v1::PHASE_SCORE, tandem::v1::PHASE_LOGPROBS,
                        tandem::v1::PHASE_UPDATE}) {
          out.push_back({p, step});
        }
      }
      if ((eval_every_ > 0 && step % eval_every_ == 0) || step == steps_) {
        out.push_back({tandem::v1::PHASE_EVAL, step});
      }
      if (checkpoint_every_ > 0 && step % checkpoint_every_ == 0) {
        out.push_back({tandem::v1::PHASE_CHECKPOINT, step});
      }
      break;
    }
  }
  return out;
}

std::optional<PlannedPhase> PhasePlan::At(PhaseCursor cursor) const {
  auto unit = Unit(cursor.unit);
  if (cursor.sub < 0 || cursor.sub >= static_cast<int64_t>(unit.size())) return std::nullopt;
  return unit[cursor.sub];
}

PhaseCursor PhasePlan::Next(PhaseCursor cursor) const {
  auto unit = Unit(cursor.unit);
  if (cursor.sub + 1 < static_cast<int64_t>(unit.size())) return {cursor.unit, cursor.sub + 1};
  return {cursor.unit + 1, 0};
}

int64_t PhasePlan::UnitOfStep(int64_t step) const {
  if (step < 1) return first_step_unit_;
  if (step > steps_) return first_step_unit_ + steps_;
  return first_step_unit_ + step - 1;
}

std::vector<PlannedPhase> PhasePlan::All() const {
  std::vector<PlannedPhase> out;
  for (int64_t u = 0; u < num_units_; ++u) {
    auto unit = Unit(u);
    out.insert(out.end(), unit.begin(), unit.end());
  }
  return out;
}

std::string PhaseUpperName(Phase phase) {
  std::string name = tandem::v1::Phase_Name(phase);
  if (name.rfind("PHASE_", 0) == 0) name = name.substr(6);
  return name;
}

std::string PhaseName(Phase phase) { return absl::AsciiStrToLower(PhaseUpperName(phase)); }

}  // namespace tandem::server
