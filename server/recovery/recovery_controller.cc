#include "server/recovery/recovery_controller.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace tandem::server {

std::optional<std::string> BeginAttempt(const RecoveryPolicy& policy, const std::string& reason, double started_at,
                                        int64_t job_step, tandem::v1::RecoveryStatus* status,
                                        tandem::v1::DriverState* state, bool* continuing) {
  if (status->recoveries() >= policy.max_recoveries) {
    return absl::StrCat(reason, " (giving up after ", status->recoveries(), " recoveries)");
  }
  *continuing = status->started_at() > 0;
  if (!*continuing) {
    status->set_started_at(started_at);
    state->set_steps_before(job_step);
    state->set_peer_failed(false);
    state->set_live_failed(false);
    status->set_wait_seconds(0);
  }
  status->set_recoveries(status->recoveries() + 1);
  status->set_reason(reason);
  return std::nullopt;
}

void NoteInflightTraining(int64_t step, PhaseCursor next, bool every_survivor_finished,
                          tandem::v1::DriverState* state) {
  if (every_survivor_finished) {
    state->set_has_last_trained(true);
    state->set_last_trained_step(step);
    state->set_last_trained_next_unit(next.unit);
    state->set_last_trained_next_sub(next.sub);
  } else {
    // A rank may have finished the step although its report says it
    // failed (a collective after the optimizer step broke): SETUP
    // accepts the in-flight step when every survivor holds it.
    state->set_has_inflight_trained(true);
    state->set_inflight_trained_step(step);
    state->set_inflight_next_unit(next.unit);
    state->set_inflight_next_sub(next.sub);
  }
}

std::string PlanDegradedRestore(const RestoreSource& disk, tandem::v1::DriverState* state) {
  std::string source;
  state->set_peer_restore_step(0);
  state->clear_peer_restore_ranks();
  state->set_restore_from("");
  if (!state->live_failed() && state->has_last_trained()) {
    state->set_live_restore(true);
    source = absl::StrCat("the survivors' live state of step ", state->last_trained_step(), " (no rollback)");
  } else {
    state->set_live_restore(false);
    state->set_restore_from(disk.path);
    if (disk.path.empty()) {
      source = "from scratch (no training step completed yet)";
    } else if (disk.step >= 0) {
      source = absl::StrCat("step ", disk.step, " from disk ", disk.path);
    } else {
      source = absl::StrCat("disk ", disk.path);
    }
  }
  state->set_peer_copy_step(0);
  state->set_peer_copy_world(0);
  return source;
}

RestorePlan PlanRestore(const RecoveryPolicy& policy, const RankPlan& plan, int old_world, const RestoreSource& disk,
                        bool grow, tandem::v1::RecoveryStatus* status, tandem::v1::DriverState* state) {
  RestorePlan out;
  out.peer = policy.peer_copies && !state->peer_failed() &&
             PeerRestorePossible(plan, old_world, state->peer_copy_step(), state->peer_copy_world()) &&
             state->peer_copy_step() >= disk.step;
  state->set_restore_from(disk.path);
  state->clear_peer_restore_ranks();
  state->set_peer_restore_step(out.peer ? state->peer_copy_step() : 0);
  if (out.peer) {
    for (int pr : plan.replaced_ranks) state->add_peer_restore_ranks(pr);
  }
  // A normal recovery ends degraded mode: every rank computes its own share.
  out.was_degraded = status->degraded_logical_world() > 0;
  status->set_degraded_logical_world(0);
  state->clear_logical_begin();
  state->clear_logical_own();
  state->set_live_restore(false);
  if (grow) status->set_grow_backs(status->grow_backs() + 1);
  // The new generation holds no complete set of copies until its next
  // checkpoint (a replacement holds none).
  out.peer_step = state->peer_copy_step();
  state->set_peer_copy_step(0);
  state->set_peer_copy_world(0);
  out.source = out.peer ? absl::StrCat("step ", out.peer_step, " from peer memory")
               : !disk.path.empty()
                   ? absl::StrCat(disk.step >= 0 ? absl::StrCat("step ", disk.step, " from ") : "", "disk ", disk.path)
                   : std::string("from scratch (no checkpoint)");
  return out;
}

SetupResume ResumeAfterSetup(const PhasePlan& plan, PhaseCursor after_setup, int64_t restored, int64_t job_step,
                             tandem::v1::DriverState* state) {
  SetupResume out;
  out.cursor = after_setup;
  out.job_step = job_step;
  out.live = state->live_restore() && state->has_last_trained();
  const bool live_inflight = out.live && state->has_inflight_trained() && restored == state->inflight_trained_step();
  out.restored_step = live_inflight   ? state->inflight_trained_step()
                      : out.live      ? state->last_trained_step()
                      : restored >= 0 ? restored
                                      : -1;
  if (out.live) {
    // The survivors kept the state after this training phase: continue
    // right after it (a warm-start step's number is negative).
    out.cursor = live_inflight ? PhaseCursor{state->inflight_next_unit(), state->inflight_next_sub()}
                               : PhaseCursor{state->last_trained_next_unit(), state->last_trained_next_sub()};
    state->set_has_last_trained(true);
    state->set_last_trained_step(out.restored_step);
    state->set_last_trained_next_unit(out.cursor.unit);
    state->set_last_trained_next_sub(out.cursor.sub);
    if (out.restored_step >= 1) out.job_step = std::max(job_step, out.restored_step);
  } else if (out.restored_step >= 0) {
    out.cursor = {plan.UnitOfStep(out.restored_step + 1), 0};
    out.job_step = out.restored_step;
    state->set_has_last_trained(out.restored_step >= 1);
    state->set_last_trained_step(out.restored_step);
    state->set_last_trained_next_unit(out.cursor.unit);
    state->set_last_trained_next_sub(0);
  } else {
    state->set_has_last_trained(false);
  }
  return out;
}

void FinishRecovery(int64_t redone, tandem::v1::RecoveryStatus* status, tandem::v1::DriverState* state) {
  status->set_steps_redone_total(status->steps_redone_total() + redone);
  status->set_started_at(0);
  state->set_restore_from("");
  state->set_peer_restore_step(0);
  state->clear_peer_restore_ranks();
  state->set_peer_failed(false);
  state->set_live_restore(false);
  state->set_live_failed(false);
  state->set_has_inflight_trained(false);
}

MemberChoice ChooseMembers(const RecoveryPolicy& policy, const MemberWait& wait, const std::string& reason) {
  MemberChoice choice;
  choice.plan = PlanRanks(wait.old_ids, wait.old_names, wait.survivors, wait.idle, wait.full);
  if (choice.plan) {
    choice.kind = MemberChoice::Kind::kPlan;
    return choice;
  }
  if (!wait.deadline_passed) {
    choice.kind = MemberChoice::Kind::kWait;
    choice.missing = wait.full - static_cast<int>(wait.survivors.size());
    return choice;
  }
  const int have = static_cast<int>(wait.survivors.size() + wait.idle.size());
  if (policy.min_workers < wait.full && have >= policy.min_workers && have >= 1) {
    choice.plan = PlanRanks(wait.old_ids, wait.old_names, wait.survivors, wait.idle, have);
    if (choice.plan) {
      choice.kind = MemberChoice::Kind::kPlan;
      return choice;
    }
  }
  choice.kind = MemberChoice::Kind::kFail;
  choice.fail_reason =
      absl::StrCat(reason, "; no replacement worker within ",
                   absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)), " (", wait.survivors.size(),
                   " of ", wait.full, " workers left, ", wait.idle.size(), " idle",
                   policy.min_workers < wait.full ? absl::StrCat(", min_workers ", policy.min_workers) : "", ")");
  return choice;
}

}  // namespace tandem::server
