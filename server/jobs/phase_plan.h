// The phase plan of a job: which PhaseCommands the coordinator issues, in
// order. A pure function of the JobSpec, addressed by a cursor so that a job
// with a billion steps needs no list. Units:
//   SFT:  0 SETUP | 1..S: SFT_STEP(s) [EVAL(s)] [CHECKPOINT(s)] | EXPORT | TEARDOWN
//   GRPO: 0 SETUP | 1..W: SFT_STEP(-k) warm start (init.sft.steps = W;
//         negative step numbers never collide with RL steps) | EVAL(0)
//         baseline | W+2..W+1+S: [SYNC_WEIGHTS(s) when disaggregated]
//         ROLLOUT(s) SCORE(s) LOGPROBS(s) UPDATE(s) [EVAL(s)] [CHECKPOINT(s)] |
//         EXPORT | TEARDOWN
// EVAL after step s when train.eval_every > 0 divides s, and after the last
// step always. CHECKPOINT when checkpoint.every > 0 divides s.
// Thread-compatible (immutable after construction).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

struct PhaseCursor {
  int64_t unit = 0;
  int64_t sub = 0;
  bool operator==(const PhaseCursor&) const = default;
};

struct PlannedPhase {
  tandem::v1::Phase phase = tandem::v1::PHASE_UNSPECIFIED;
  int64_t step = 0;
  bool warmup = false;  // SFT warm start of a GRPO job
};

enum class UnitKind { kSetup, kWarmup, kBaseline, kStep, kExport, kTeardown };

class PhasePlan {
 public:
  explicit PhasePlan(const tandem::v1::JobSpec& spec);

  int64_t num_units() const { return num_units_; }
  UnitKind KindOf(int64_t unit) const;
  // Step number of a unit (warm start: -k; baseline: 0; setup/export: 0).
  int64_t StepOf(int64_t unit) const;
  std::vector<PlannedPhase> Unit(int64_t unit) const;
  // The phase at the cursor; nullopt when the plan is complete.
  std::optional<PlannedPhase> At(PhaseCursor cursor) const;
  // The cursor after completing At(cursor).
  PhaseCursor Next(PhaseCursor cursor) const;
  // Where a warm start that reached init.sft.stop_accuracy continues: the
  // baseline evaluation, skipping the remaining warm-start steps.
  PhaseCursor AfterWarmStart() const { return {warmup_ + 1, 0}; }
  // The unit that runs `step` (1..steps); past the last step: the export
  // unit. Where a job restored from a checkpoint of step s continues: s + 1.
  int64_t UnitOfStep(int64_t step) const;
  // Whole plan (tests and small jobs only).
  std::vector<PlannedPhase> All() const;

 private:
  tandem::v1::JobKind kind_;
  int64_t steps_ = 0;
  int64_t warmup_ = 0;
  int64_t eval_every_ = 0;
  int64_t checkpoint_every_ = 0;
  bool disaggregated_ = false;
  int64_t first_step_unit_ = 1;
  int64_t num_units_ = 0;
};

// "rollout", "sft_step", ... (metrics labels and messages use these).
std::string PhaseName(tandem::v1::Phase phase);
std::string PhaseUpperName(tandem::v1::Phase phase);  // "ROLLOUT"

}  // namespace tandem::server
