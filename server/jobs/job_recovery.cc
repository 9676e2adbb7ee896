// JobManager's recovery state machine: losses and preemptions become a
// recovery request; the driver thread runs the recovery (new generation,
// members chosen, restore source picked) and the plan continues after the
// restored step (job_manager.h). The decisions it applies are pure
// functions in server/recovery/policy.h.
#include <algorithm>
#include <map>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/coordinator_metrics.h"
#include "server/jobs/job_manager.h"
#include "server/recovery/policy.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::Job;
using tandem::v1::JobState;
using tandem::v1::StepMetrics;

void JobManager::OnWorkerLost(const LostWorker& lost) {
  absl::MutexLock lock(&mu_);
  if (lost.job_id.empty()) return;
  JobRecord* r = FindLocked(lost.job_id);
  if (r == nullptr || IsTerminal(r->job.state()) || !r->fail_reason.empty()) return;
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), lost.worker_id);
  if (it == ids.end()) return;  // no longer a member (already replaced)
  int rank = static_cast<int>(it - ids.begin());
  const std::string what = absl::StrCat("worker ", lost.worker_id,
                                        lost.name.empty() ? "" : absl::StrCat(" (", lost.name, ")"), " rank ", rank,
                                        " lost: ", lost.reason);
  EventLocked(r, "worker", what);
  // A worker that dies while restoring a checkpoint may have been killed by
  // it (a file damaged in a way the loader does not catch): the second loss
  // restoring the same checkpoint marks it bad, and recovery falls back to
  // the one before.
  auto* rec = r->job.mutable_recovery();
  if (r->inflight && r->inflight->phase() == tandem::v1::PHASE_SETUP && !rec->restore_from().empty()) {
    const std::string path = rec->restore_from();
    const auto& bad = rec->bad_checkpoints();
    if (++r->restore_losses[path] >= 2 && std::find(bad.begin(), bad.end(), path) == bad.end()) {
      rec->add_bad_checkpoints(path);
      EventLocked(r, "recovery",
                  absl::StrCat("checkpoint ", path, " is unusable (", r->restore_losses[path],
                               " workers were lost while restoring it): falling back to the previous one"));
    }
  }
  RequestRecoveryLocked(r, what, lost.worker_id);
}

void JobManager::OnWorkerPreempting(const std::string& worker_id, const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(job_id);
  if (r == nullptr || IsTerminal(r->job.state())) return;
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), worker_id);
  if (it == ids.end() || r->preempting.count(worker_id)) return;
  r->preempting.insert(worker_id);
  EventLocked(r, "worker", absl::StrCat("worker ", worker_id, " rank ", it - ids.begin(),
                                        " is being preempted: handing it over at the next step boundary"));
  changed_.SignalAll();
}

void JobManager::RequestRecoveryLocked(JobRecord* r, const std::string& reason, const std::string& suspect) {
  if (IsTerminal(r->job.state()) || !r->fail_reason.empty()) return;
  r->grow_back = false;  // a loss overrides a planned grow back
  if (!suspect.empty()) r->suspects.insert(suspect);
  // While the driver is choosing the new members it sees every loss itself.
  if (r->choosing_members) return;
  if (r->recover_reason.empty()) {
    r->recover_reason = reason;
    r->recover_requested_at = clock_->WallSeconds();
    spdlog::warn("job {}: recovering: {}", r->job.id(), reason);
  }
  changed_.SignalAll();
}

bool JobManager::HandlePreemptionLocked(JobRecord* r) {
  if (r->preempting.empty() || r->extra || r->job.state() != tandem::v1::JOB_STATE_RUNNING) return false;
  // Step boundary: the cursor starts a unit after SETUP.
  if (r->cursor.sub != 0 || r->cursor.unit == 0) return false;
  const auto& ids = r->job.worker_ids();
  std::vector<std::string> leaving;
  for (const auto& w : r->preempting) {
    if (std::find(ids.begin(), ids.end(), w) != ids.end()) leaving.push_back(w);
  }
  if (leaving.empty()) {
    r->preempting.clear();
    return false;
  }
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, r->job.spec());
  const int64_t step = r->job.step();
  int64_t newest_on_disk = -1;
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) {
    for (const auto& c : *records) newest_on_disk = std::max(newest_on_disk, c.step());
  }
  const int64_t newest = std::max(r->job.recovery().peer_copy_step(), newest_on_disk);
  const bool fits = r->last_checkpoint_seconds * 1000.0 <= static_cast<double>(policy.preempt_checkpoint_budget_ms);
  if (step > 0 && step > newest && r->preempt_checkpoint_step != step && fits &&
      !r->job.spec().checkpoint().dir().empty()) {
    r->preempt_checkpoint_step = step;
    r->extra = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
    EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", step, " before handing over preempted worker ",
                                              absl::StrJoin(leaving, ", ")));
    return false;  // the driver issues it now
  }
  // The peer copy leaves with the workers when every member is preempted at
  // once (a whole allocation ends): the checkpoint's background write must be
  // on disk before the handover. One flush; if the write failed, hand over
  // anyway and recover from the newest checkpoint there is.
  if (r->preempt_checkpoint_step == step && newest_on_disk < step && r->preempt_flush_step != step) {
    r->preempt_flush_step = step;
    r->extra = PlannedPhase{tandem::v1::PHASE_FLUSH_CHECKPOINTS, step};
    return false;
  }
  std::string reason = absl::StrCat("worker ", absl::StrJoin(leaving, ", "), " preempted (SIGTERM)");
  if (step > newest && !fits) {
    absl::StrAppend(&reason, "; no checkpoint: the last one took ",
                    absl::StrFormat("%.1f s", r->last_checkpoint_seconds), ", over the ",
                    policy.preempt_checkpoint_budget_ms, " ms budget");
  }
  for (const auto& w : leaving) r->suspects.insert(w);
  r->preempting.clear();
  RequestRecoveryLocked(r, reason, "");
  return true;
}

bool JobManager::HandleGrowBackLocked(JobRecord* r) {
  if (r->extra || r->job.state() != tandem::v1::JOB_STATE_RUNNING || !r->recover_reason.empty()) return false;
  // A step boundary right after a training step, with a training step next.
  if (r->cursor.sub != 0 || r->cursor.unit < 1 || r->plan->KindOf(r->cursor.unit - 1) != UnitKind::kStep ||
      r->plan->KindOf(r->cursor.unit) != UnitKind::kStep) {
    return false;
  }
  const auto& spec = r->job.spec();
  const int full = std::max(1, spec.cluster().workers());
  const int current = r->job.worker_ids_size();
  if (current >= full || spec.placement().mode() == "disaggregated") return false;
  int idle = 0;
  for (const auto& w : membership_->Idle()) idle += w.device() == spec.cluster().device() ? 1 : 0;
  const bool degraded = r->job.recovery().degraded_logical_world() > 0;
  // A degraded job's shares are re-split only to the full size.
  if (idle == 0 || (degraded && current + idle < full)) return false;
  const int64_t step = r->job.step();
  int64_t newest = -1;
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) {
    const auto& bad_list = r->job.recovery().bad_checkpoints();
    auto usable = ChooseCheckpoint(*records, std::set<std::string>(bad_list.begin(), bad_list.end()));
    if (usable) newest = usable->step();
  }
  if (newest < step) {
    // The state must be on disk first: the new world restores (reshards) it.
    const int every = spec.checkpoint().every();
    const bool planned_checkpoint = every > 0 && step % every == 0;
    if (!planned_checkpoint && r->grow_checkpoint_step != step) {
      r->grow_checkpoint_step = step;
      r->extra = PlannedPhase{tandem::v1::PHASE_CHECKPOINT, step};
      EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", step, " before growing back to ",
                                                std::min(full, current + idle), " of ", full, " ranks"));
      return false;  // the driver issues it now
    }
    if (r->grow_flush_step != step) {
      r->grow_flush_step = step;
      r->extra = PlannedPhase{tandem::v1::PHASE_FLUSH_CHECKPOINTS, step};
      return false;
    }
    return false;  // flushed and still not recorded: the write failed; try after the next step
  }
  r->grow_target = std::min(full, current + idle);
  r->recover_reason = absl::StrCat("growing back from ", current, " to ", r->grow_target, " of ", full,
                                   " ranks (idle workers available)");
  r->recover_requested_at = clock_->WallSeconds();
  r->grow_back = true;
  spdlog::info("job {}: {}", r->job.id(), r->recover_reason);
  return true;
}

bool JobManager::RecoverDegradedLocked(JobRecord* r, const std::vector<std::string>& old_ids,
                                       const std::set<std::string>& survivors) {
  if (survivors.empty()) return false;
  auto* rec = r->job.mutable_recovery();
  const int logical_world =
      rec->degraded_logical_world() > 0 ? rec->degraded_logical_world() : static_cast<int>(old_ids.size());
  std::vector<int> surviving_ranks;
  std::vector<std::string> ids;
  for (size_t i = 0; i < old_ids.size(); ++i) {
    if (!survivors.count(old_ids[i])) continue;
    surviving_ranks.push_back(static_cast<int>(i));
    ids.push_back(old_ids[i]);
  }
  const std::vector<int> old_begin(rec->logical_begin().begin(), rec->logical_begin().end());
  const std::vector<int> old_own(rec->logical_own().begin(), rec->logical_own().end());
  const LogicalShares shares =
      DegradedShares(rec->degraded_logical_world() > 0 ? old_begin : std::vector<int>{},
                     rec->degraded_logical_world() > 0 ? old_own : std::vector<int>{}, surviving_ranks,
                     static_cast<int>(old_ids.size()));
  if (absl::Status s = membership_->Reassign(r->job.id(), ids); !s.ok()) {
    spdlog::info("job {}: degraded reassign: {} (normal recovery instead)", r->job.id(), s.ToString());
    return false;
  }
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (!survivors.count(id)) leaving.push_back(id);
  }
  membership_->Release(r->job.id(), leaving);
  if (rec->detect_seconds() == 0) {
    double detect = 0;
    for (const auto& id : leaving) {
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0) detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  const bool was_degraded = rec->degraded_logical_world() > 0;
  rec->set_degraded_logical_world(logical_world);
  rec->clear_logical_begin();
  rec->clear_logical_own();
  for (size_t i = 0; i < shares.begin.size(); ++i) {
    rec->add_logical_begin(shares.begin[i]);
    rec->add_logical_own(shares.own[i]);
  }
  if (!was_degraded) rec->set_degraded_since_step(r->job.step() + 1);
  // Restore source: the live state (no rollback), else disk, else scratch.
  std::string source;
  rec->set_peer_restore_step(0);
  rec->clear_peer_restore_ranks();
  rec->set_restore_from("");
  if (!rec->live_failed() && rec->has_last_trained()) {
    rec->set_live_restore(true);
    source = absl::StrCat("the survivors' live state of step ", rec->last_trained_step(), " (no rollback)");
  } else {
    rec->set_live_restore(false);
    std::set<std::string> bad(rec->bad_checkpoints().begin(), rec->bad_checkpoints().end());
    std::optional<tandem::v1::CheckpointRecord> disk;
    auto records = store_->ListCheckpoints(r->job.id());
    if (records.ok()) disk = ChooseCheckpoint(*records, bad);
    if (disk) {
      rec->set_restore_from(disk->path());
      source = absl::StrCat("step ", disk->step(), " from disk ", disk->path());
    } else if (!r->job.spec().resume_from().empty() && !bad.count(r->job.spec().resume_from())) {
      rec->set_restore_from(r->job.spec().resume_from());
      source = absl::StrCat("disk ", r->job.spec().resume_from());
    } else {
      source = "from scratch (no training step completed yet)";
    }
  }
  rec->set_peer_copy_step(0);
  rec->set_peer_copy_world(0);
  r->job.clear_worker_ids();
  for (const auto& id : ids) r->job.add_worker_ids(id);
  r->cursor = {};
  r->suspects.clear();
  for (const auto& id : leaving) r->preempting.erase(id);
  PersistLocked(*r);
  std::vector<std::string> blocks;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int end = i + 1 < shares.begin.size() ? shares.begin[i + 1] : logical_world;
    blocks.push_back(absl::StrCat("rank ", i, " (", ids[i], ") shares ", shares.begin[i], "-", end - 1));
  }
  EventLocked(r, "recovery",
              absl::StrCat("degraded: generation ", r->job.generation(), " continues on ", ids.size(), " of ",
                           logical_world, " ranks without waiting (", absl::StrJoin(blocks, ", "),
                           r->job.spec().recovery().degraded_cheap_backward()
                               ? "; cheap backward (no attention backward, MLP recomputed) for taken-over shares"
                               : "",
                           r->job.spec().recovery().degraded_low_rank() > 0
                               ? absl::StrCat("; rank-", r->job.spec().recovery().degraded_low_rank(),
                                              " MLP weight gradients for taken-over shares")
                               : "",
                           "); restoring ", source));
  return true;
}

void JobManager::RecoverLocked(JobRecord* r) {
  const RecoveryPolicy policy = EffectiveRecoveryPolicy(config_, r->job.spec());
  auto* rec = r->job.mutable_recovery();
  const std::string reason = r->recover_reason;
  r->recover_reason.clear();
  const bool grow = r->grow_back;
  r->grow_back = false;
  if (rec->recoveries() >= policy.max_recoveries) {
    r->fail_reason = absl::StrCat(reason, " (giving up after ", rec->recoveries(), " recoveries)");
    return;
  }
  const bool continuing = rec->started_at() > 0;  // a previous attempt of this recovery failed
  if (!continuing) {
    rec->set_started_at(r->recover_requested_at > 0 ? r->recover_requested_at : clock_->WallSeconds());
    rec->set_steps_before(r->job.step());
    rec->set_peer_failed(false);
    rec->set_live_failed(false);
    rec->set_wait_seconds(0);
  }
  rec->set_recoveries(rec->recoveries() + 1);
  CoordinatorMetrics::Global().RecoveryStarted();
  rec->set_reason(reason);
  const std::vector<std::string> old_ids(r->job.worker_ids().begin(), r->job.worker_ids().end());
  std::map<std::string, std::string> old_names;
  for (const auto& id : old_ids) {
    auto info = membership_->Get(id);
    if (info.ok()) old_names[id] = info->name();
  }
  // The old generation ends: communicators aborted, rendezvous scope dropped.
  for (const auto& id : old_ids) {
    tandem::v1::WorkerCommand abort;
    abort.set_abort_job(r->job.id());
    membership_->Send(id, abort).IgnoreError();
  }
  kv_->DropJob(r->job.id());
  // Ranks that finished the training phase in flight before the failure hold
  // the state after it: a degraded recovery keeps that when every survivor did.
  std::set<std::string> finished_inflight;
  std::optional<PlannedPhase> inflight_training;
  if (r->inflight && !r->extra &&
      (r->inflight->phase() == tandem::v1::PHASE_SFT_STEP || r->inflight->phase() == tandem::v1::PHASE_UPDATE)) {
    inflight_training = PlannedPhase{r->inflight->phase(), r->inflight->step()};
    for (const auto& [rank, rep] : r->reports) {
      if (rep.ok() && rank < static_cast<int>(old_ids.size())) finished_inflight.insert(old_ids[rank]);
    }
  }
  const PhaseCursor inflight_cursor = r->cursor;
  r->inflight.reset();
  r->reports.clear();
  r->extra.reset();
  const int64_t old_generation = r->job.generation();
  r->job.set_generation(old_generation + 1);
  r->job.set_state(tandem::v1::JOB_STATE_RECOVERING);
  r->job.set_reason(reason);
  PersistLocked(*r);
  EventLocked(r, "recovery", absl::StrCat("recovering (generation ", old_generation, " -> ", r->job.generation(),
                                          ", attempt ", rec->recoveries(), "): ", reason));

  // Wait for the survivors and replacements. A short settle first: a killed
  // worker's stream and lease end a moment after its peers see the error.
  const absl::Time wait_start = absl::Now();
  const absl::Time deadline = wait_start + absl::Milliseconds(policy.replacement_timeout_ms);
  const int full = std::max(1, r->job.spec().cluster().workers());
  r->choosing_members = true;
  auto stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || r->cancel_requested; };
  mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(std::min<int64_t>(300, config_.lease_ms())));
  std::optional<RankPlan> plan;
  std::set<std::string> survivors;
  auto alive_members = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::set<std::string> alive;
    for (const auto& id : old_ids) {
      if (!r->suspects.count(id) && membership_->InJobAndAlive(id, r->job.id())) alive.insert(id);
    }
    return alive;
  };
  auto idle_candidates = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<Candidate> idle;
    for (const auto& w : membership_->Idle()) {
      if (w.device() == r->job.spec().cluster().device()) idle.push_back({w.id(), w.name()});
    }
    return idle;
  };
  bool planned = false;
  if (grow) {
    // A planned grow back: the idle workers are there now, or it is off.
    survivors = alive_members();
    plan = PlanRanks(old_ids, old_names, survivors, idle_candidates(), r->grow_target);
    if (plan && membership_->Reassign(r->job.id(), plan->worker_ids).ok()) {
      planned = true;
    } else {
      plan.reset();
      EventLocked(r, "recovery", "grow back called off: the idle workers are gone");
    }
  }
  if (!planned && policy.degraded) {
    if (stop()) {
      r->choosing_members = false;
      return;
    }
    survivors = alive_members();
    rec->set_has_inflight_trained(false);
    if (inflight_training && !survivors.empty()) {
      const PhaseCursor next = r->plan->Next(inflight_cursor);
      if (absl::c_all_of(survivors, [&](const std::string& id) { return finished_inflight.count(id) > 0; })) {
        rec->set_has_last_trained(true);
        rec->set_last_trained_step(inflight_training->step);
        rec->set_last_trained_next_unit(next.unit);
        rec->set_last_trained_next_sub(next.sub);
      } else {
        // A rank may have finished the step although its report says it
        // failed (a collective after the optimizer step broke): SETUP
        // accepts the in-flight step when every survivor holds it.
        rec->set_has_inflight_trained(true);
        rec->set_inflight_trained_step(inflight_training->step);
        rec->set_inflight_next_unit(next.unit);
        rec->set_inflight_next_sub(next.sub);
      }
    }
    if (RecoverDegradedLocked(r, old_ids, survivors)) {
      r->choosing_members = false;
      rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));
      return;
    }
  }
  bool reported_wait = false;
  while (!planned) {
    if (stop()) {
      r->choosing_members = false;
      return;
    }
    survivors = alive_members();
    const std::vector<Candidate> idle = idle_candidates();
    plan = PlanRanks(old_ids, old_names, survivors, idle, full);
    if (!plan && absl::Now() >= deadline) {
      const int have = static_cast<int>(survivors.size() + idle.size());
      if (policy.min_workers < full && have >= policy.min_workers && have >= 1) {
        plan = PlanRanks(old_ids, old_names, survivors, idle, have);
      }
      if (!plan) {
        r->choosing_members = false;
        r->fail_reason = absl::StrCat(reason, "; no replacement worker within ",
                                      absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)), " (",
                                      survivors.size(), " of ", full, " workers left, ", idle.size(), " idle",
                                      policy.min_workers < full ? absl::StrCat(", min_workers ", policy.min_workers) : "",
                                      ")");
        return;
      }
    }
    if (plan) {
      absl::Status s = membership_->Reassign(r->job.id(), plan->worker_ids);
      if (s.ok()) break;
      spdlog::info("job {}: reassign: {} (retrying)", r->job.id(), s.ToString());
      plan.reset();
    } else if (!reported_wait) {
      reported_wait = true;
      EventLocked(r, "recovery", absl::StrCat("waiting up to ",
                                              absl::FormatDuration(absl::Milliseconds(policy.replacement_timeout_ms)),
                                              " for ", full - static_cast<int>(survivors.size()),
                                              " replacement worker(s)"));
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100));
  }
  r->choosing_members = false;
  std::vector<std::string> leaving;
  for (const auto& id : old_ids) {
    if (std::find(plan->worker_ids.begin(), plan->worker_ids.end(), id) == plan->worker_ids.end()) {
      leaving.push_back(id);
    }
  }
  membership_->Release(r->job.id(), leaving);
  // Detection: the lost workers' last sign of life -> the request.
  if (!continuing) {
    double detect = 0;
    for (const auto& id : old_ids) {
      if (survivors.count(id)) continue;
      auto info = membership_->Get(id);
      if (info.ok() && info->last_heartbeat() > 0) detect = std::max(detect, rec->started_at() - info->last_heartbeat());
    }
    rec->set_detect_seconds(std::max(0.0, detect));
  }
  rec->set_wait_seconds(rec->wait_seconds() + absl::ToDoubleSeconds(absl::Now() - wait_start));

  // Restore source: peer memory, else the newest good disk checkpoint, else
  // the job's resume_from, else scratch.
  std::set<std::string> bad(rec->bad_checkpoints().begin(), rec->bad_checkpoints().end());
  std::optional<tandem::v1::CheckpointRecord> disk;
  auto records = store_->ListCheckpoints(r->job.id());
  if (records.ok()) disk = ChooseCheckpoint(*records, bad);
  std::string restore_from;
  int64_t disk_step = -1;
  if (disk) {
    restore_from = disk->path();
    disk_step = disk->step();
  } else if (!r->job.spec().resume_from().empty() && !bad.count(r->job.spec().resume_from())) {
    restore_from = r->job.spec().resume_from();
  }
  const bool peer = policy.peer_copies && !rec->peer_failed() &&
                    PeerRestorePossible(*plan, static_cast<int>(old_ids.size()), rec->peer_copy_step(),
                                        rec->peer_copy_world()) &&
                    rec->peer_copy_step() >= disk_step;
  rec->set_restore_from(restore_from);
  rec->clear_peer_restore_ranks();
  rec->set_peer_restore_step(peer ? rec->peer_copy_step() : 0);
  if (peer) {
    for (int pr : plan->replaced_ranks) rec->add_peer_restore_ranks(pr);
  }
  // A normal recovery ends degraded mode: every rank computes its own share.
  const bool was_degraded = rec->degraded_logical_world() > 0;
  rec->set_degraded_logical_world(0);
  rec->clear_logical_begin();
  rec->clear_logical_own();
  rec->set_live_restore(false);
  if (grow) rec->set_grow_backs(rec->grow_backs() + 1);
  // The new generation holds no complete set of copies until its next
  // checkpoint (a replacement holds none).
  const int64_t peer_step = rec->peer_copy_step();
  rec->set_peer_copy_step(0);
  rec->set_peer_copy_world(0);
  r->job.clear_worker_ids();
  for (const auto& id : plan->worker_ids) r->job.add_worker_ids(id);
  r->cursor = {};
  r->suspects.clear();
  for (const auto& id : leaving) r->preempting.erase(id);
  PersistLocked(*r);
  std::string source = peer ? absl::StrCat("step ", peer_step, " from peer memory")
                       : !restore_from.empty()
                           ? absl::StrCat(disk_step >= 0 ? absl::StrCat("step ", disk_step, " from ") : "", "disk ",
                                          restore_from)
                           : std::string("from scratch (no checkpoint)");
  std::vector<std::string> replaced;
  for (int pr : plan->replaced_ranks) {
    replaced.push_back(absl::StrCat("rank ", pr, " -> ", plan->worker_ids[pr]));
  }
  EventLocked(r, "recovery",
              absl::StrCat(grow ? absl::StrCat("growing back to ", plan->worker_ids.size(), " of ", full, " ranks",
                                               was_degraded ? " (degraded mode ends)" : "", ": ")
                                : "",
                           "generation ", r->job.generation(), " on ", absl::StrJoin(plan->worker_ids, ", "),
                           plan->same_world || static_cast<int>(plan->worker_ids.size()) >= full
                               ? ""
                               : absl::StrCat(" (elastic: ", plan->worker_ids.size(), " of ", full, " ranks)"),
                           replaced.empty() ? "" : absl::StrCat(" (", absl::StrJoin(replaced, ", "), ")"),
                           "; restoring ", source));
}


}  // namespace tandem::server
