// JobDriver's recovery state machine: losses and preemptions become a
// recovery request; the driver thread runs the recovery (new generation,
// members chosen, restore source picked) and the plan continues after the
// restored step (job_driver.h). The decisions it applies are pure
// functions in server/recovery/policy.h.
#include <algorithm>
#include <map>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/coordinator_metrics.h"
#include "server/jobs/job_driver.h"
#include "server/recovery/checkpoint_catalogue.h"
#include "server/recovery/policy.h"
#include "server/recovery/recovery_controller.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::Job;
using tandem::v1::JobState;
using tandem::v1::StepMetrics;

void JobDriver::OnWorkerLost(const LostWorker& lost) {
  {
    absl::MutexLock lock(&inbox_mu_);
    lost_inbox_.push_back(lost);
    inbox_pending_ = true;
  }
  // The driver's waits re-evaluate their conditions when mu_ is released:
  // release it once if it is free; if it is held, its holder's release
  // does (and every wait also looks at the inbox each kInboxPollInterval).
  if (mu_.TryLock()) mu_.Unlock();
}

bool JobDriver::DrainInboxLocked() {
  if (!inbox_pending_.load()) return false;
  std::vector<LostWorker> lost;
  {
    absl::MutexLock lock(&inbox_mu_);
    lost.swap(lost_inbox_);
    inbox_pending_ = false;
  }
  for (const auto& l : lost) HandleLostLocked(l);
  return !lost.empty();
}

size_t JobDriver::InboxSizeForTest() const {
  absl::MutexLock lock(&inbox_mu_);
  return lost_inbox_.size();
}

void JobDriver::HoldLockForTest(absl::Notification* held, absl::Notification* release) {
  absl::MutexLock lock(&mu_);
  held->Notify();
  release->WaitForNotificationWithTimeout(absl::Seconds(60));
}

void JobDriver::HandleLostLocked(const LostWorker& lost) {
  if (IsTerminal(job_.state()) || !fail_reason_.empty()) return;
  const auto& ids = job_.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), lost.worker_id);
  if (it == ids.end()) return;  // no longer a member (already replaced)
  int rank = static_cast<int>(it - ids.begin());
  const std::string what =
      absl::StrCat("worker ", lost.worker_id, lost.name.empty() ? "" : absl::StrCat(" (", lost.name, ")"), " rank ",
                   rank, " lost: ", lost.reason);
  EventLocked("worker", what);
  // A worker that dies while restoring a checkpoint may have been killed by
  // it (a file damaged in a way the loader does not catch): the second loss
  // restoring the same checkpoint marks it bad, and recovery falls back to
  // the one before.
  if (inflight_ && inflight_->phase() == tandem::v1::PHASE_SETUP && !state_.restore_from().empty()) {
    const std::string path = state_.restore_from();
    if (++restore_losses_[path] >= 2 && CatalogueLocked().MarkBad(path)) {
      EventLocked("recovery", absl::StrCat("checkpoint ", path, " is unusable (", restore_losses_[path],
                                           " workers were lost while restoring it): falling back to the previous one"));
    }
  }
  RequestRecoveryLocked(what, lost.worker_id);
}

void JobDriver::OnWorkerPreempting(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(job_.state())) return;
  const auto& ids = job_.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), worker_id);
  if (it == ids.end() || preempting_.count(worker_id)) return;
  preempting_.insert(worker_id);
  EventLocked("worker", absl::StrCat("worker ", worker_id, " rank ", it - ids.begin(),
                                     " is being preempted: handing it over at the next step boundary"));
}

void JobDriver::RequestRecoveryLocked(const std::string& reason, const std::string& suspect) {
  if (IsTerminal(job_.state()) || !fail_reason_.empty()) return;
  grow_back_ = false;  // a loss overrides a planned grow back
  if (!suspect.empty()) suspects_.insert(suspect);
  // While the driver is choosing the new members it sees every loss itself.
  if (choosing_members_) return;
  if (recover_reason_.empty()) {
    recover_reason_ = reason;
    recover_requested_at_ = clock_->WallSeconds();
    spdlog::warn("job {}: recovering: {}", job_.id(), reason);
  }
}

bool JobDriver::HandlePreemptionLocked() {
  if (preempting_.empty() || extra_ || job_.state() != tandem::v1::JOB_STATE_RUNNING) return false;
  // Step boundary: the cursor starts a unit after SETUP.
  if (cursor_.sub != 0 || cursor_.unit == 0) return false;
  const auto& ids = job_.worker_ids();
  std::vector<std::string> leaving;
  for (const auto& w : preempting_) {
    if (std::find(ids.begin(), ids.end(), w) != ids.end()) leaving.push_back(w);
  }
  if (leaving.empty()) {
    preempting_.clear();
    return false;
  }
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, job_.spec());
  const int64_t step = job_.step();
  const int64_t newest_on_disk = CatalogueLocked().NewestStep();
  const int64_t newest = std::max(state_.peer_copy_step(), newest_on_disk);
  const bool fits = last_checkpoint_seconds_ * 1000.0 <= static_cast<double>(policy.preempt_checkpoint_budget_ms);
  if (step > 0 && step > newest && preempt_checkpoint_step_ != step && fits &&
      !job_.spec().checkpoint().dir().empty()) {
    preempt_checkpoint_step_ = step;
    extra_ = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
    EventLocked("checkpoint", absl::StrCat("checkpoint of step ", step, " before handing over preempted worker ",
                                           absl::StrJoin(leaving, ", ")));
    return false;  // the driver issues it now
  }
  // The peer copy leaves with the workers when every member is preempted at
  // once (a whole allocation ends): the checkpoint's background write must be
  // on disk before the handover. One flush; if the write failed, hand over
  // anyway and recover from the newest checkpoint there is.
  if (preempt_checkpoint_step_ == step && newest_on_disk < step && preempt_flush_step_ != step) {
    preempt_flush_step_ = step;
    extra_ = PlannedPhase{tandem::v1::PHASE_FLUSH_CHECKPOINTS, step};
    return false;
  }
  std::string reason = absl::StrCat("worker ", absl::StrJoin(leaving, ", "), " preempted (SIGTERM)");
  if (step > newest && !fits) {
    absl::StrAppend(&reason, "; no checkpoint: the last one took ", absl::StrFormat("%.1f s", last_checkpoint_seconds_),
                    ", over the ", policy.preempt_checkpoint_budget_ms, " ms budget");
  }
  for (const auto& w : leaving) suspects_.insert(w);
  preempting_.clear();
  RequestRecoveryLocked(reason, "");
  return true;
}

bool JobDriver::HandleGrowBackLocked() {
  if (extra_ || job_.state() != tandem::v1::JOB_STATE_RUNNING || !recover_reason_.empty()) return false;
  // A step boundary right after a training step, with a training step next.
  if (cursor_.sub != 0 || cursor_.unit < 1 || plan_->KindOf(cursor_.unit - 1) != UnitKind::kStep ||
      plan_->KindOf(cursor_.unit) != UnitKind::kStep) {
    return false;
  }
  const auto& spec = job_.spec();
  const int full = std::max(1, spec.cluster().workers());
  const int current = job_.worker_ids_size();
  if (current >= full || spec.placement().mode() == "disaggregated") return false;
  int idle = 0;
  for (const auto& w : membership_->Idle()) idle += w.device() == spec.cluster().device() ? 1 : 0;
  const bool degraded = job_.recovery().degraded_logical_world() > 0;
  // A degraded job's shares are re-split only to the full size.
  if (idle == 0 || (degraded && current + idle < full)) return false;
  const int64_t step = job_.step();
  const auto usable = CatalogueLocked().NewestUsable();
  const int64_t newest = usable ? usable->step() : -1;
  if (newest < step) {
    // The state must be on disk first: the new world restores (reshards) it.
    const int every = spec.checkpoint().every();
    const bool planned_checkpoint = every > 0 && step % every == 0;
    if (!planned_checkpoint && grow_checkpoint_step_ != step) {
      grow_checkpoint_step_ = step;
      extra_ = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
      EventLocked("checkpoint", absl::StrCat("checkpoint of step ", step, " before growing back to ",
                                             std::min(full, current + idle), " of ", full, " ranks"));
      return false;  // the driver issues it now
    }
    if (grow_flush_step_ != step) {
      grow_flush_step_ = step;
      extra_ = PlannedPhase{tandem::v1::PHASE_FLUSH_CHECKPOINTS, step};
      return false;
    }
    return false;  // flushed and still not recorded: the write failed; try after the next step
  }
  grow_target_ = std::min(full, current + idle);
  recover_reason_ = absl::StrCat("growing back from ", current, " to ", grow_target_, " of ", full,
                                 " ranks (idle workers available)");
  recover_requested_at_ = clock_->WallSeconds();
  grow_back_ = true;
  spdlog::info("job {}: {}", job_.id(), recover_reason_);
  return true;
}

bool JobDriver::RecoverDegradedLocked(const std::vector<std::string>& old_ids, const std::set<std::string>& survivors) {
  if (survivors.empty()) return false;
  auto* rec = job_.mutable_recovery();
  const int logical_world =
      rec->degraded_logical_world() > 0 ? rec->degraded_logical_world() : static_cast<int>(old_ids.size());
  std::vector<int> surviving_ranks;
  std::vector<std::string> ids;
  for (size_t i = 0; i < old_ids.size(); ++i) {
    if (!survivors.count(old_ids[i])) continue;
    surviving_ranks.push_back(static_cast<int>(i));
    ids.push_back(old_ids[i]);
  }
  const std::vector<int> old_begin(state_.logical_begin().begin(), state_.logical_begin().end());
  const std::vector<int> old_own(state_.logical_own().begin(), state_.logical_own().end());
  const LogicalShares shares = DegradedShares(rec->degraded_logical_world() > 0 ? old_begin : std::vector<int>{},
                                              rec->degraded_logical_world() > 0 ? old_own : std::vector<int>{},
                                              surviving_ranks, static_cast<int>(old_ids.size()));
  if (absl::Status s = membership_->Reassign(job_.id(), ids); !s.ok()) {
    spdlog::info("job {}: degraded reassign: {} (normal recovery instead)", job_.id(), s.ToString());
    return false;
  }
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (!survivors.count(id)) leaving.push_back(id);
  }
  membership_->Release(job_.id(), leaving);
  if (rec->detect_seconds() == 0) {
    double detect = 0;
    for (const auto& id : leaving) {
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0)
        detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  const bool was_degraded = rec->degraded_logical_world() > 0;
  rec->set_degraded_logical_world(logical_world);
  state_.clear_logical_begin();
  state_.clear_logical_own();
  for (size_t i = 0; i < shares.begin.size(); ++i) {
    state_.add_logical_begin(shares.begin[i]);
    state_.add_logical_own(shares.own[i]);
  }
  if (!was_degraded) rec->set_degraded_since_step(job_.step() + 1);
  // Restore source: the live state (no rollback), else disk, else scratch.
  const std::string source = PlanDegradedRestore(CatalogueLocked().ChooseRestore(job_.spec().resume_from()), &state_);
  job_.clear_worker_ids();
  for (const auto& id : ids) job_.add_worker_ids(id);
  cursor_ = {};
  suspects_.clear();
  for (const auto& id : leaving) preempting_.erase(id);
  SaveLocked();
  std::vector<std::string> blocks;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int end = i + 1 < shares.begin.size() ? shares.begin[i + 1] : logical_world;
    blocks.push_back(absl::StrCat("rank ", i, " (", ids[i], ") shares ", shares.begin[i], "-", end - 1));
  }
  EventLocked("recovery",
              absl::StrCat("degraded: generation ", job_.generation(), " continues on ", ids.size(), " of ",
                           logical_world, " ranks without waiting (", absl::StrJoin(blocks, ", "),
                           job_.spec().recovery().degraded_cheap_backward()
                               ? "; cheap backward (no attention backward, MLP recomputed) for taken-over shares"
                               : "",
                           job_.spec().recovery().degraded_low_rank() > 0
                               ? absl::StrCat("; rank-", job_.spec().recovery().degraded_low_rank(),
                                              " MLP weight gradients for taken-over shares")
                               : "",
                           "); restoring ", source));
  return true;
}

void JobDriver::RecoverLocked() {
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, job_.spec());
  auto* rec = job_.mutable_recovery();
  const std::string reason = recover_reason_;
  recover_reason_.clear();
  const bool grow = grow_back_;
  grow_back_ = false;
  bool continuing = false;  // a previous attempt of this recovery failed
  if (auto give_up =
          BeginAttempt(policy, reason, recover_requested_at_ > 0 ? recover_requested_at_ : clock_->WallSeconds(),
                       job_.step(), rec, &state_, &continuing)) {
    fail_reason_ = *give_up;
    return;
  }
  CoordinatorMetrics::Global().RecoveryStarted();
  const std::vector<std::string> old_ids(job_.worker_ids().begin(), job_.worker_ids().end());
  std::map<std::string, std::string> old_names;
  for (const auto& id : old_ids) {
    auto info = membership_->Get(id);
    if (info.ok()) old_names[id] = info->name();
  }
  // The old generation ends: communicators aborted, rendezvous scope dropped.
  for (const auto& id : old_ids) {
    tandem::v1::WorkerCommand abort;
    abort.set_abort_job(job_.id());
    membership_->Send(id, abort).IgnoreError();
  }
  kv_->DropJob(job_.id());
  // Ranks that finished the training phase in flight before the failure hold
  // the state after it: a degraded recovery keeps that when every survivor did.
  std::set<std::string> finished_inflight;
  std::optional<PlannedPhase> inflight_training;
  if (inflight_ && !extra_ &&
      (inflight_->phase() == tandem::v1::PHASE_SFT_STEP || inflight_->phase() == tandem::v1::PHASE_UPDATE)) {
    inflight_training = PlannedPhase{inflight_->phase(), inflight_->step()};
    for (const auto& [rank, rep] : reports_) {
      if (rep.ok() && rank < static_cast<int>(old_ids.size())) finished_inflight.insert(old_ids[rank]);
    }
  }
  const PhaseCursor inflight_cursor = cursor_;
  inflight_.reset();
  reports_.clear();
  extra_.reset();
  const int64_t old_generation = job_.generation();
  job_.set_generation(old_generation + 1);
  job_.set_state(tandem::v1::JOB_STATE_RECOVERING);
  job_.set_reason(reason);
  SaveLocked();
  EventLocked("recovery", absl::StrCat("recovering (generation ", old_generation, " -> ", job_.generation(),
                                       ", attempt ", rec->recoveries(), "): ", reason));

  // Wait for the survivors and replacements. A short settle first: a killed
  // worker's stream and lease end a moment after its peers see the error.
  const absl::Time wait_start = absl::Now();
  const absl::Time deadline = wait_start + absl::Milliseconds(policy.replacement_timeout_ms);
  const int full = std::max(1, job_.spec().cluster().workers());
  choosing_members_ = true;
  auto stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || cancel_requested_; };
  mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(std::min<int64_t>(300, config_.lease_ms())));
  DrainInboxLocked();
  std::optional<RankPlan> plan;
  std::set<std::string> survivors;
  auto alive_members = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::set<std::string> alive;
    for (const auto& id : old_ids) {
      if (!suspects_.count(id) && membership_->InJobAndAlive(id, job_.id())) alive.insert(id);
    }
    return alive;
  };
  auto idle_candidates = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Candidate> idle;
    for (const auto& w : membership_->Idle()) {
      if (w.device() == job_.spec().cluster().device()) idle.push_back({w.id(), w.name()});
    }
    return idle;
  };
  bool planned = false;
  if (grow) {
    // A planned grow back: the idle workers are there now, or it is off.
    survivors = alive_members();
    plan = PlanRanks(old_ids, old_names, survivors, idle_candidates(), grow_target_);
    if (plan && membership_->Reassign(job_.id(), plan->worker_ids).ok()) {
      planned = true;
    } else {
      plan.reset();
      EventLocked("recovery", "grow back called off: the idle workers are gone");
    }
  }
  if (!planned && policy.degraded) {
    if (stop()) {
      choosing_members_ = false;
      return;
    }
    survivors = alive_members();
    state_.set_has_inflight_trained(false);
    if (inflight_training && !survivors.empty()) {
      const PhaseCursor next = plan_->Next(inflight_cursor);
      NoteInflightTraining(
          inflight_training->step, next,
          absl::c_all_of(survivors, [&](const std::string& id) { return finished_inflight.count(id) > 0; }), &state_);
    }
    if (RecoverDegradedLocked(old_ids, survivors)) {
      choosing_members_ = false;
      rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));
      return;
    }
  }
  // The wait for replacements: at each wake-up (the inbox, a cancel, or
  // every 100 ms for the workers that register) the controller's
  // ChooseMembers decides from what the driver sees.
  bool reported_wait = false;
  while (!planned) {
    if (stop()) {
      choosing_members_ = false;
      return;
    }
    MemberWait wait;
    wait.old_ids = old_ids;
    wait.old_names = old_names;
    wait.survivors = survivors = alive_members();
    wait.idle = idle_candidates();
    wait.full = full;
    wait.deadline_passed = absl::Now() >= deadline;
    MemberChoice choice = ChooseMembers(policy, wait, reason);
    if (choice.kind == MemberChoice::Kind::kFail) {
      choosing_members_ = false;
      fail_reason_ = choice.fail_reason;
      return;
    }
    if (choice.kind == MemberChoice::Kind::kPlan) {
      plan = std::move(choice.plan);
      absl::Status s = membership_->Reassign(job_.id(), plan->worker_ids);
      if (s.ok()) break;
      spdlog::info("job {}: reassign: {} (retrying)", job_.id(), s.ToString());
      plan.reset();
    } else if (!reported_wait) {
      reported_wait = true;
      EventLocked("recovery", absl::StrCat("waiting up to ",
                                           absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)),
                                           " for ", choice.missing, " replacement worker(s)"));
    }
    auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop() || inbox_pending_.load(); };
    mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Milliseconds(100));
    DrainInboxLocked();
  }
  choosing_members_ = false;
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (std::find(plan->worker_ids.begin(), plan->worker_ids.end(), id) == plan->worker_ids.end()) {
      leaving.push_back(id);
    }
  }
  membership_->Release(job_.id(), leaving);
  // Detection: the lost workers' last sign of life -> the request.
  if (!continuing) {
    double detect = 0;
    for (const auto& id : old_ids) {
      if (survivors.count(id)) continue;
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0)
        detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));

  // Restore source: peer memory, else the newest good disk checkpoint, else
  // the job's resume_from, else scratch.
  const RestorePlan restore =
      PlanRestore(policy, *plan, static_cast<int>(old_ids.size()),
                  CatalogueLocked().ChooseRestore(job_.spec().resume_from()), grow, job_.mutable_recovery(), &state_);
  const bool was_degraded = restore.was_degraded;
  job_.clear_worker_ids();
  for (const auto& id : plan->worker_ids) job_.add_worker_ids(id);
  cursor_ = {};
  suspects_.clear();
  for (const auto& id : leaving) preempting_.erase(id);
  SaveLocked();
  const std::string& source = restore.source;
  std::vector<std::string> replaced;
  for (int pr : plan->replaced_ranks) {
    replaced.push_back(absl::StrCat("rank ", pr, " -> ", plan->worker_ids[pr]));
  }
  EventLocked("recovery",
              absl::StrCat(grow ? absl::StrCat("growing back to ", plan->worker_ids.size(), " of ", full, " ranks",
                                               was_degraded ? " (degraded mode ends)" : "", ": ")
                                : "",
                           "generation ", job_.generation(), " on ", absl::StrJoin(plan->worker_ids, ", "),
                           plan->same_world || static_cast<int>(plan->worker_ids.size()) >= full
                               ? ""
                               : absl::StrCat(" (elastic: ", plan->worker_ids.size(), " of ", full, " ranks)"),
                           replaced.empty() ? "" : absl::StrCat(" (", absl::StrJoin(replaced, ", "), ")"),
                           "; restoring ", source));
}

}  // namespace tandem::server
