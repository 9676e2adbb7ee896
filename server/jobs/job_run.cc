// JobDriver's thread: the loop that issues a job's phases and completes
// them when every rank has reported (job_driver.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_path.h"
#include "common/phase_failure.h"
#include "server/coordinator_metrics.h"
#include "server/jobs/job_driver.h"
#include "server/jobs/job_limits.h"
#include "server/jobs/phase_commands.h"
#include "server/jobs/step_metrics.h"
#include "server/recovery/recovery_controller.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::JobState;
using tandem::v1::StepMetrics;

void JobDriver::Run() {
  while (true) {
    PlannedPhase phase;
    std::vector<std::string> workers;
    std::vector<tandem::v1::WorkerCommand> commands;
    int64_t timeout_ms = 0;
    WriteTicket durable = 0;  // the state the command depends on
    {
      absl::MutexLock lock(&mu_);
      DrainInboxLocked();
      if (stopping_) break;
      if (cancel_requested_) {
        FinishLocked(tandem::v1::JOB_STATE_CANCELLED, cancel_reason_);
        break;
      }
      if (!fail_reason_.empty()) {
        FinishLocked(tandem::v1::JOB_STATE_FAILED, fail_reason_);
        break;
      }
      if (!recover_reason_.empty()) {
        RecoverLocked();
        continue;
      }
      if (HandlePreemptionLocked()) continue;
      if (HandleGrowBackLocked()) continue;
      auto at = extra_ ? extra_ : plan_->At(cursor_);
      if (!at) {
        FinishLocked(tandem::v1::JOB_STATE_SUCCEEDED, "");
        break;
      }
      phase = *at;
      timeout_ms = phase.phase == tandem::v1::PHASE_SETUP ? config_.setup_timeout_ms() : config_.phase_timeout_ms();
      tandem::v1::PhaseCommand cmd = MakePhaseCommand(job_, cursor_, phase, extra_.has_value(), timeout_ms);
      inflight_ = cmd;
      inflight_sent_ = false;
      inflight_started_ = absl::Now();
      reports_.clear();
      workers.assign(job_.worker_ids().begin(), job_.worker_ids().end());
      const std::vector<std::string> nodes =
          phase.phase == tandem::v1::PHASE_SETUP ? RankNodesLocked() : std::vector<std::string>{};
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        commands.push_back(CommandForRank(job_, state_, *inflight_, static_cast<int>(rank), config_.runs_dir(), nodes));
      }
      durable = write_ticket_;
    }
    // The command goes out only once the cursor (and everything the job
    // wrote before it) is durable: a restarted coordinator resumes at this
    // phase or a later one, never an earlier one the workers have passed.
    // The wait holds no lock, so the job's reports and Cancel are answered.
    if (!AwaitDurableBeforeSend(durable)) break;
    {
      absl::MutexLock lock(&mu_);
      inflight_sent_ = true;
      inflight_started_ = absl::Now();
    }
    for (size_t rank = 0; rank < workers.size(); ++rank) {
      membership_->Send(workers[rank], std::move(commands[rank])).IgnoreError();
    }
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = inflight_started_ + absl::Milliseconds(timeout_ms);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || cancel_requested_ || !fail_reason_.empty() || !recover_reason_.empty() ||
             reports_.size() == workers.size();
    };
    auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done() || inbox_pending_.load(); };
    // Losses from the reaper arrive in the inbox: handled here, then the
    // wait goes on unless one of them asked for a recovery.
    while (true) {
      mu_.AwaitWithDeadline(absl::Condition(&woken), std::min(deadline, absl::Now() + kInboxPollInterval));
      DrainInboxLocked();
      if (done() || absl::Now() >= deadline) break;
    }
    if (stopping_) break;
    if (cancel_requested_ || !fail_reason_.empty() || !recover_reason_.empty()) continue;
    const std::string where = absl::StrCat(phase.step != 0 ? absl::StrCat("step ", phase.step, " ") : "", "phase ",
                                           PhaseUpperName(phase.phase));
    if (reports_.size() != workers.size()) {
      std::vector<std::string> missing;
      std::string suspect;
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        if (!reports_.count(static_cast<int>(rank))) {
          missing.push_back(absl::StrCat(workers[rank], " (rank ", rank, ")"));
          suspects_.insert(workers[rank]);
          suspect = workers[rank];
        }
      }
      RequestRecoveryLocked(
          absl::StrCat(where, " timed out after ", absl::FormatDuration(absl::Milliseconds(timeout_ms)),
                       " waiting for ", absl::StrJoin(missing, ", ")),
          suspect);
      continue;
    }
    auto* rec = job_.mutable_recovery();
    for (const auto& [rank, rep] : reports_) {
      if (rep.ok()) continue;
      const std::string what = absl::StrCat(where, " failed on worker ", workers[rank], " (rank ", rank,
                                            "): ", rep.error().empty() ? "no message" : rep.error());
      const bool in_recovery = rec->started_at() > 0;
      if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && state_.live_restore() && !state_.live_failed()) {
        state_.set_live_failed(true);
        EventLocked("recovery", absl::StrCat("live-state restore failed (", what, "): restoring from disk"));
        RequestRecoveryLocked(what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && state_.peer_restore_step() > 0 &&
                 !state_.peer_failed()) {
        state_.set_peer_failed(true);
        EventLocked("recovery", absl::StrCat("peer-memory restore failed (", what, "): falling back to disk"));
        RequestRecoveryLocked(what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && !state_.restore_from().empty() &&
                 common::ReportFailureKind(rep) == tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED) {
        const std::string bad = state_.restore_from();
        CatalogueLocked().MarkBad(bad);
        EventLocked("recovery", absl::StrCat("checkpoint ", bad, " is unusable (", rep.error(),
                                             "): falling back to the previous one"));
        RequestRecoveryLocked(what, "");
      } else {
        fail_reason_ = what;
      }
      break;
    }
    if (!fail_reason_.empty() || !recover_reason_.empty()) continue;
    CompletePhaseLocked(phase);
  }
  absl::MutexLock lock(&mu_);
  thread_done_ = true;
  running_ = false;
  reapable_ = true;
}

bool JobDriver::AwaitDurableBeforeSend(WriteTicket ticket) {
  while (true) {
    absl::Status s = store_->WaitDurable(ticket, absl::Now() + kDurableWaitSlice);
    if (!absl::IsDeadlineExceeded(s)) {
      host_->NoteStoreWrite(s);
      // A write that failed is logged and noted (the coordinator is not
      // ready); the job runs on, as with any failed write.
      if (!s.ok()) spdlog::error("job {}: state not stored before the next command: {}", id_, s.ToString());
      return true;
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
  }
}

void JobDriver::CompletePhaseLocked(const PlannedPhase& phase) {
  const double wall = absl::ToDoubleSeconds(absl::Now() - inflight_started_);
  CoordinatorMetrics::Global().PhaseCompleted(phase.phase, wall, reports_);
  if (phase.phase == tandem::v1::PHASE_CHECKPOINT) {
    last_checkpoint_seconds_ = wall;
    // Every rank keeps its neighbour's shard in memory (worker/engine/peer_snapshot.h).
    bool all_copied = reports_.size() > 1;
    for (const auto& [rank, rep] : reports_) all_copied = all_copied && rep.checkpoint().peer_copy();
    if (all_copied) {
      state_.set_peer_copy_step(phase.step);
      state_.set_peer_copy_world(job_.worker_ids_size());
    }
  }
  if (extra_) {  // an unplanned phase: the cursor stays
    extra_.reset();
    inflight_.reset();
    reports_.clear();
    SaveLocked();
    return;
  }
  const int64_t unit = cursor_.unit;
  if (plan_->KindOf(unit) == UnitKind::kSetup) {
    CompleteSetupLocked(wall);
    return;
  }
  if (acc_unit_ != unit) {
    step_acc_.Clear();
    acc_unit_ = unit;
  }
  StepMetrics& acc = step_acc_;
  const auto& rank0 = reports_.at(0);
  MergeMetrics(&acc, rank0.metrics());
  const std::string name = PhaseName(phase.phase);
  double worker_max = 0;
  int64_t peak = 0;
  for (const auto& [rank, rep] : reports_) {
    worker_max = std::max(worker_max, rep.seconds());
    peak = std::max({peak, rep.peak_memory_bytes(), rep.metrics().peak_memory_bytes()});
    AddTierBytes(&acc, rep.metrics());
  }
  (*acc.mutable_phase_seconds())[name] += wall;
  (*acc.mutable_extra())[absl::StrCat(name, "_worker_seconds")] = worker_max;
  (*acc.mutable_extra())[absl::StrCat(name, "_peak_memory_bytes")] = static_cast<double>(peak);
  acc.set_peak_memory_bytes(std::max(acc.peak_memory_bytes(), peak));
  const bool held = WarmStartHeld(rank0.metrics());
  const std::string probe = TeacherForcedExact(rank0.metrics());
  inflight_.reset();
  reports_.clear();  // rank0 is gone from here on
  PhaseCursor next = plan_->Next(cursor_);
  const UnitKind kind = plan_->KindOf(unit);
  if (kind == UnitKind::kWarmup && held && next.unit <= plan_->AfterWarmStart().unit) {
    // The warm start reached its skill level (init.sft.stop_accuracy): the
    // model no longer changes, so the remaining steps would only re-check it.
    const int64_t done = -phase.step;
    EventLocked("warm_start",
                absl::StrCat("warm start reached init.sft.stop_accuracy ", job_.spec().init().sft_stop_accuracy(),
                             " at step ", done, "/", job_.spec().init().sft_steps(), " (teacher-forced exact ", probe,
                             "); skipping the remaining ", job_.spec().init().sft_steps() - done));
    next = plan_->AfterWarmStart();
  }
  cursor_ = next;
  if (phase.phase == tandem::v1::PHASE_SFT_STEP || phase.phase == tandem::v1::PHASE_UPDATE) {
    // What a degraded recovery keeps: every rank has finished this step.
    state_.set_has_last_trained(true);
    state_.set_last_trained_step(phase.step);
    state_.set_last_trained_next_unit(next.unit);
    state_.set_last_trained_next_sub(next.sub);
  }
  const bool unit_done = next.unit != unit;
  if (unit_done && (kind == UnitKind::kStep || kind == UnitKind::kWarmup || kind == UnitKind::kBaseline)) {
    acc.set_step(plan_->StepOf(unit));
    acc.set_wall_time(clock_->WallSeconds());
    if (kind == UnitKind::kWarmup) (*acc.mutable_extra())["warmup"] = 1;
    if (kind == UnitKind::kBaseline) (*acc.mutable_extra())["baseline"] = 1;
    *job_.mutable_latest() = acc;
    if (kind == UnitKind::kStep) job_.set_step(acc.step());
    if (kind == UnitKind::kStep) CoordinatorMetrics::Global().StepCompleted(job_.spec().kind());
    SaveLocked();
    std::string summary = kind == UnitKind::kWarmup
                              ? absl::StrCat("warm-start step ", -acc.step(), "/", job_.spec().init().sft_steps())
                          : kind == UnitKind::kBaseline ? std::string("baseline evaluation")
                                                        : StepSummary(acc, job_.total_steps());
    EventLocked("step", summary, &acc);
  } else {
    SaveLocked();
  }
}

void JobDriver::CompleteSetupLocked(double wall) {
  // Where the plan continues: after the restored checkpoint's step.
  int64_t restored = -1, skipped = 0;
  double restore_s = 0;
  int source = tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
  for (const auto& [rank, rep] : reports_) {
    const tandem::v1::SetupResult& setup = rep.setup();
    if (rank == 0 && setup.restored()) restored = setup.restored_step();
    restore_s = std::max(restore_s, setup.restore_seconds());
    source = std::max<int>(source, setup.restore_source());
    skipped = std::max(skipped, setup.checkpoints_skipped());
  }
  inflight_.reset();
  reports_.clear();
  auto* rec = job_.mutable_recovery();
  const SetupResume resume = ResumeAfterSetup(*plan_, plan_->Next(cursor_), restored, job_.step(), &state_);
  cursor_ = resume.cursor;
  job_.set_step(resume.job_step);
  const bool live = resume.live;
  const int64_t restored_step = resume.restored_step;
  const bool from_peer = source == tandem::v1::RESTORE_SOURCE_PEER;
  const char* from = live ? "live memory" : from_peer ? "peer memory" : restored_step >= 0 ? "disk" : "scratch";
  if (skipped > 0) {
    EventLocked("recovery",
                absl::StrCat(skipped, " newer checkpoint(s) failed verification; used step ", restored_step));
  }
  if (rec->started_at() > 0) {
    const double total = clock_->WallSeconds() - rec->started_at();
    const double rendezvous = std::max(0.0, wall - restore_s);
    const int64_t redone = live ? 0 : std::max<int64_t>(0, state_.steps_before() - std::max<int64_t>(0, restored_step));
    StepMetrics m;
    m.set_step(std::max<int64_t>(0, restored_step));
    m.set_wall_time(clock_->WallSeconds());
    auto& x = *m.mutable_extra();
    x["recovery_seconds"] = total;
    x["detect_seconds"] = rec->detect_seconds();
    x["wait_seconds"] = rec->wait_seconds();
    x["rendezvous_seconds"] = rendezvous;
    x["restore_seconds"] = restore_s;
    x["restore_source"] = live                 ? tandem::v1::RESTORE_SOURCE_LIVE
                          : from_peer          ? tandem::v1::RESTORE_SOURCE_PEER
                          : restored_step >= 0 ? tandem::v1::RESTORE_SOURCE_DISK
                                               : tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
    x["degraded"] = rec->degraded_logical_world() > 0 ? 1 : 0;
    x["steps_redone"] = static_cast<double>(redone);
    x["world_size"] = job_.worker_ids_size();
    x["generation"] = static_cast<double>(job_.generation());
    FinishRecovery(redone, rec, &state_);
    job_.set_state(tandem::v1::JOB_STATE_RUNNING);
    job_.set_reason("");
    SaveLocked();
    EventLocked("recovery",
                absl::StrFormat("recovered in %.2f s: detect %.2f s, wait %.2f s, rendezvous %.2f s, restore %.2f s "
                                "from %s; resuming at step %d (%d step%s redone)",
                                total, rec->detect_seconds(), rec->wait_seconds(), rendezvous, restore_s, from,
                                std::max<int64_t>(0, restored_step) + 1, redone, redone == 1 ? "" : "s"),
                &m);
    EventLocked("state", "job running");
    return;
  }
  SaveLocked();
  EventLocked("state", restored_step >= 0 ? absl::StrFormat("setup done on every worker; resumed from step %d "
                                                            "(%s), continuing at step %d",
                                                            restored_step, from, restored_step + 1)
                                          : std::string("setup done on every worker"));
}

std::vector<std::string> JobDriver::RankNodesLocked() const {
  std::vector<std::string> nodes;
  for (const auto& id : job_.worker_ids()) {
    auto w = membership_->Get(id);
    if (!w.ok() || w->node().empty()) return {};
    nodes.push_back(w->node());
  }
  return nodes;
}

}  // namespace tandem::server
