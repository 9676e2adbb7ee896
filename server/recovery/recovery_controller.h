// Recovery controller: the steps of one recovery as functions over a job's
// typed state - the user-facing RecoveryStatus (Job.recovery) and the
// driver's own DriverState (driver_state.proto). The job driver
// (server/jobs/job_recovery.cc) runs them in this order, around the parts
// that wait or send (ending the old generation, waking up while the
// members are chosen):
//   BeginAttempt          count the attempt, stamp its start, reset the
//                         per-recovery flags, or give up
//   NoteInflightTraining  (degraded) what the survivors hold of the
//                         training phase in flight at the failure
//   PlanDegradedRestore   (degraded) live state, else disk, else scratch
//   ChooseMembers         one look at the survivors and idle workers while
//                         waiting for replacements: plan, wait, or fail
//   PlanRestore           a new generation: peer memory, else disk, else
//                         resume_from, else scratch; degraded mode ends
//   ResumeAfterSetup      where the plan continues after SETUP restored
//   FinishRecovery        the recovery's cursors cleared, steps redone counted
// Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/jobs/phase_plan.h"
#include "server/recovery/checkpoint_catalogue.h"
#include "server/recovery/policy.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

// A new attempt of the recovery in progress, or the first one. Returns the
// reason to give up (max_recoveries reached) or nullopt. *continuing: a
// previous attempt of this recovery failed (its start and waits count on).
std::optional<std::string> BeginAttempt(const RecoveryPolicy& policy, const std::string& reason, double started_at,
                                        int64_t job_step, tandem::v1::RecoveryStatus* status,
                                        tandem::v1::DriverState* state, bool* continuing);

// The training phase in flight at the failure (step, and the cursor after
// it): when every survivor finished it the survivors hold the state after
// it; otherwise SETUP accepts it only when every survivor holds it.
void NoteInflightTraining(int64_t step, PhaseCursor next, bool every_survivor_finished, tandem::v1::DriverState* state);

// Degraded continuation's restore source: the survivors' live state (no
// rollback) unless that failed in this recovery, else `disk` (see
// CheckpointCatalogue::ChooseRestore). Returns the source in words.
std::string PlanDegradedRestore(const RestoreSource& disk, tandem::v1::DriverState* state);

// What the driver sees at one wake-up while it waits for the members of
// the new generation.
struct MemberWait {
  std::vector<std::string> old_ids;              // by old rank
  std::map<std::string, std::string> old_names;  // id -> name
  std::set<std::string> survivors;               // old members alive and not suspect
  std::vector<Candidate> idle;                   // idle workers of the job's device
  int full = 1;                                  // cluster.workers
  bool deadline_passed = false;                  // replacement_timeout_ms is over
};
struct MemberChoice {
  enum class Kind { kWait, kPlan, kFail };
  Kind kind = Kind::kWait;
  std::optional<RankPlan> plan;  // kPlan: the ranks to reassign
  int missing = 0;               // kWait: replacements still needed
  std::string fail_reason;       // kFail: the job's failure (after `reason`)
};
// Full size when enough workers are there; once the deadline passed, an
// elastic job (min_workers below full) takes what is there if at least
// min_workers (and 1); else the job fails with the counts.
MemberChoice ChooseMembers(const RecoveryPolicy& policy, const MemberWait& wait, const std::string& reason);

struct RestorePlan {
  bool peer = false;  // from the neighbours' memory
  int64_t peer_step = 0;
  bool was_degraded = false;  // degraded mode ends with this recovery
  std::string source;         // in words, for the event
};
// A normal recovery onto `plan`: peer memory when every replaced rank's
// holder survived and its copy is not older than `disk`, else `disk`.
// Degraded mode ends; the new generation holds no peer copies yet.
RestorePlan PlanRestore(const RecoveryPolicy& policy, const RankPlan& plan, int old_world, const RestoreSource& disk,
                        bool grow, tandem::v1::RecoveryStatus* status, tandem::v1::DriverState* state);

struct SetupResume {
  PhaseCursor cursor;          // where the plan continues
  int64_t restored_step = -1;  // -1: from scratch
  bool live = false;           // the survivors' live state was kept
  int64_t job_step = 0;        // the job's step from here on
};
// After SETUP: `after_setup` is the plan's cursor after SETUP, `restored`
// rank 0's restored step (-1 when nothing was restored).
SetupResume ResumeAfterSetup(const PhasePlan& plan, PhaseCursor after_setup, int64_t restored, int64_t job_step,
                             tandem::v1::DriverState* state);

// The recovery in progress ended with `redone` steps computed again.
void FinishRecovery(int64_t redone, tandem::v1::RecoveryStatus* status, tandem::v1::DriverState* state);

}  // namespace tandem::server
