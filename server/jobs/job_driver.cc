// JobManager's per-job driver: the loop that issues a job's phases, the
// reports that complete them, and the job's end (job_manager.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_path.h"
#include "common/phase_failure.h"
#include "server/coordinator_metrics.h"
#include "server/jobs/job_limits.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/phase_commands.h"
#include "server/jobs/step_metrics.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

// The node of each rank of `job` (empty when a worker is unknown).
std::vector<std::string> RankNodes(const Membership& membership, const tandem::v1::Job& job) {
  std::vector<std::string> nodes;
  for (const auto& id : job.worker_ids()) {
    auto w = membership.Get(id);
    if (!w.ok() || w->node().empty()) return {};
    nodes.push_back(w->node());
  }
  return nodes;
}

}  // namespace

using tandem::v1::Job;
using tandem::v1::JobState;
using tandem::v1::StepMetrics;

absl::Status JobManager::OnReport(const tandem::v1::ReportPhaseRequest& report) {
  absl::MutexLock lock(&mu_);
  JobRecord* r = FindLocked(report.job_id());
  if (r == nullptr) return absl::NotFoundError(absl::StrCat("job_id: no job '", report.job_id(), "'"));
  const auto& ids = r->job.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), report.worker_id());
  // Nothing in a report is used before its sender is known to be a member.
  if (it == ids.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", report.worker_id(), " is not part of job ", report.job_id()));
  }
  const std::string& root = r->job.spec().checkpoint().dir();
  for (int i = 0; i < report.checkpoints_size(); ++i) {
    const auto& c = report.checkpoints(i);
    if (!common::IsCheckpointStepPath(c.path(), root, c.step())) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoints[", i, "]: path '", c.path(), "' of step ", c.step(),
                                                     " is not the job's checkpoint directory of that step (",
                                                     common::CheckpointStepPath(root, std::max<int64_t>(c.step(), 1)),
                                                     ")"));
    }
  }
  // A published checkpoint is complete whoever of the members reports it
  // (any rank, any phase: the background write finishes later), even from an
  // old generation or with a phase that failed after it was published.
  if (!IsTerminal(r->job.state())) {
    for (const auto& published : report.checkpoints()) RecordCheckpointLocked(r, report.generation(), published);
  }
  const int rank = static_cast<int>(it - ids.begin());
  std::vector<std::string> lines(report.log_lines().begin(), report.log_lines().end());
  LogLocked(r, absl::StrCat("rank", rank), lines);
  if (IsTerminal(r->job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", r->job.id(), " is ", JobStateName(r->job.state()), ": drop its state"));
  }
  if (report.generation() != r->job.generation()) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", report.generation(), " is stale; job ",
                                                      r->job.id(), " is at generation ", r->job.generation()));
  }
  if (!r->inflight || r->inflight->command_id() != report.command_id()) {
    spdlog::debug("job {}: ignoring report for {} (not in flight)", r->job.id(), report.command_id());
    return absl::OkStatus();
  }
  if (r->reports.count(rank)) return absl::OkStatus();  // duplicate (re-sent command)
  r->reports[rank] = report;
  // A communicator failure (a peer died, a collective timed out or was
  // aborted) is the cluster's, not the job's: recover without waiting for
  // the other ranks, which may hang on the dead peer until aborted.
  if (common::ReportFailureKind(report) == tandem::v1::PHASE_FAILURE_KIND_RETRYABLE) {
    RequestRecoveryLocked(r,
                          absl::StrCat(report.step() != 0 ? absl::StrCat("step ", report.step(), " ") : "",
                                       "phase ", PhaseUpperName(report.phase()), " failed on worker ",
                                       report.worker_id(), " (rank ", rank, "): ", report.error()),
                          "");
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

void JobManager::RecordCheckpointLocked(JobRecord* r, int64_t generation,
                                        const tandem::v1::PublishedCheckpoint& published) {
  tandem::v1::CheckpointRecord rec;
  rec.set_job_id(r->job.id());
  rec.set_step(published.step());
  rec.set_path(published.path());
  rec.set_generation(generation);
  rec.set_world_size(r->job.worker_ids_size());
  rec.set_bytes(published.bytes());
  rec.set_time(clock_->WallSeconds());
  auto existing = store_->HasCheckpoint(rec);
  if (existing.ok() && *existing) return;
  CoordinatorMetrics::Global().CheckpointPublished(published.bytes());
  absl::Status s = store_->AddCheckpoint(rec);
  if (!s.ok()) spdlog::error("job {} checkpoint record: {}", r->job.id(), s.ToString());
  // Rank 0 applies checkpoint.keep right after publishing (ckpt::ApplyRetention):
  // list only what is still on disk. Without a keep the catalogue still
  // holds only the newest kMaxCheckpointRecordsPerJob (older ones stay on disk).
  {
    const int64_t keep = r->job.spec().checkpoint().keep();
    s = store_->PruneCheckpoints(r->job.id(), keep > 0 ? std::min(keep, kMaxCheckpointRecordsPerJob)
                                                       : kMaxCheckpointRecordsPerJob);
    if (!s.ok()) spdlog::error("job {} checkpoint records: {}", r->job.id(), s.ToString());
  }
  // A path rewritten by a redo is good again.
  auto* bad = r->job.mutable_recovery()->mutable_bad_checkpoints();
  bad->erase(std::remove(bad->begin(), bad->end(), rec.path()), bad->end());
  EventLocked(r, "checkpoint", absl::StrCat("checkpoint of step ", rec.step(), " at ", rec.path()));
}


void JobManager::OnWorkerAttached(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, r] : jobs_) {
    if ((r->job.state() != tandem::v1::JOB_STATE_RUNNING && r->job.state() != tandem::v1::JOB_STATE_RECOVERING) ||
        !r->inflight) {
      continue;
    }
    const auto& ids = r->job.worker_ids();
    auto it = std::find(ids.begin(), ids.end(), worker_id);
    if (it == ids.end()) continue;
    int rank = static_cast<int>(it - ids.begin());
    if (!r->reports.count(rank)) {
      membership_->Resend(worker_id, CommandForRank(r->job, *r->inflight, rank, config_.runs_dir(),
                                                    RankNodes(*membership_, r->job)));
    }
  }
}


void JobManager::FinishLocked(JobRecord* r, JobState state, const std::string& reason) {
  const auto& ids = r->job.worker_ids();
  std::vector<std::string> workers(ids.begin(), ids.end());
  if (state != tandem::v1::JOB_STATE_SUCCEEDED) {
    for (const auto& w : workers) {
      tandem::v1::WorkerCommand abort;
      abort.set_abort_job(r->job.id());
      membership_->Send(w, abort).IgnoreError();
    }
  }
  membership_->Release(r->job.id(), workers);
  kv_->DropJob(r->job.id());
  r->inflight.reset();
  r->job.set_state(state);
  r->job.set_reason(reason);
  r->job.set_finished_at(clock_->WallSeconds());
  PersistLocked(*r);
  std::string message = absl::StrCat("job ", JobStateName(state));
  if (!reason.empty()) absl::StrAppend(&message, ": ", reason);
  EventLocked(r, "state", message);
  spdlog::info("job {}: {}", r->job.id(), message);
  schedule_requested_ = true;
}

void JobManager::StartRunnerLocked(JobRecord* r) {
  if (r->runner.joinable()) {
    if (!r->runner_done) return;
    r->runner.join();
  }
  r->runner_done = false;
  r->runner = std::thread([this, r] { RunJob(r); });
}

void JobManager::RunJob(JobRecord* r) {
  while (true) {
    PlannedPhase phase;
    std::vector<std::string> workers;
    std::vector<tandem::v1::WorkerCommand> commands;
    int64_t timeout_ms = 0;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      if (r->cancel_requested) {
        FinishLocked(r, tandem::v1::JOB_STATE_CANCELLED, r->cancel_reason);
        break;
      }
      if (!r->fail_reason.empty()) {
        FinishLocked(r, tandem::v1::JOB_STATE_FAILED, r->fail_reason);
        break;
      }
      if (!r->recover_reason.empty()) {
        RecoverLocked(r);
        continue;
      }
      if (HandlePreemptionLocked(r)) continue;
      if (HandleGrowBackLocked(r)) continue;
      auto at = r->extra ? r->extra : r->plan->At(r->cursor);
      if (!at) {
        FinishLocked(r, tandem::v1::JOB_STATE_SUCCEEDED, "");
        break;
      }
      phase = *at;
      timeout_ms = phase.phase == tandem::v1::PHASE_SETUP ? config_.setup_timeout_ms() : config_.phase_timeout_ms();
      tandem::v1::PhaseCommand cmd = MakePhaseCommand(r->job, r->cursor, phase, r->extra.has_value(), timeout_ms);
      r->inflight = cmd;
      r->inflight_started = absl::Now();
      r->reports.clear();
      workers.assign(r->job.worker_ids().begin(), r->job.worker_ids().end());
      const std::vector<std::string> nodes =
          phase.phase == tandem::v1::PHASE_SETUP ? RankNodes(*membership_, r->job) : std::vector<std::string>{};
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        commands.push_back(CommandForRank(r->job, *r->inflight, static_cast<int>(rank), config_.runs_dir(), nodes));
      }
    }
    for (size_t rank = 0; rank < workers.size(); ++rank) {
      membership_->Send(workers[rank], std::move(commands[rank])).IgnoreError();
    }
    absl::MutexLock lock(&mu_);
    const absl::Time deadline = r->inflight_started + absl::Milliseconds(timeout_ms);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || r->cancel_requested || !r->fail_reason.empty() || !r->recover_reason.empty() ||
             r->reports.size() == workers.size();
    };
    mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    if (stopping_) break;
    if (r->cancel_requested || !r->fail_reason.empty() || !r->recover_reason.empty()) continue;
    const std::string where =
        absl::StrCat(phase.step != 0 ? absl::StrCat("step ", phase.step, " ") : "", "phase ",
                     PhaseUpperName(phase.phase));
    if (r->reports.size() != workers.size()) {
      std::vector<std::string> missing;
      std::string suspect;
      for (size_t rank = 0; rank < workers.size(); ++rank) {
        if (!r->reports.count(static_cast<int>(rank))) {
          missing.push_back(absl::StrCat(workers[rank], " (rank ", rank, ")"));
          r->suspects.insert(workers[rank]);
          suspect = workers[rank];
        }
      }
      RequestRecoveryLocked(r,
                            absl::StrCat(where, " timed out after ",
                                         absl::FormatDuration(absl::Milliseconds(timeout_ms)), " waiting for ",
                                         absl::StrJoin(missing, ", ")),
                            suspect);
      continue;
    }
    auto* rec = r->job.mutable_recovery();
    for (const auto& [rank, rep] : r->reports) {
      if (rep.ok()) continue;
      const std::string what = absl::StrCat(where, " failed on worker ", workers[rank], " (rank ", rank, "): ",
                                            rep.error().empty() ? "no message" : rep.error());
      const bool in_recovery = rec->started_at() > 0;
      if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && rec->live_restore() && !rec->live_failed()) {
        rec->set_live_failed(true);
        EventLocked(r, "recovery", absl::StrCat("live-state restore failed (", what, "): restoring from disk"));
        RequestRecoveryLocked(r, what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && rec->peer_restore_step() > 0 &&
          !rec->peer_failed()) {
        rec->set_peer_failed(true);
        EventLocked(r, "recovery", absl::StrCat("peer-memory restore failed (", what, "): falling back to disk"));
        RequestRecoveryLocked(r, what, "");
      } else if (phase.phase == tandem::v1::PHASE_SETUP && in_recovery && !rec->restore_from().empty() &&
                 common::ReportFailureKind(rep) == tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED) {
        const std::string bad = rec->restore_from();
        rec->add_bad_checkpoints(bad);
        EventLocked(r, "recovery",
                    absl::StrCat("checkpoint ", bad, " is unusable (", rep.error(), "): falling back to the previous one"));
        RequestRecoveryLocked(r, what, "");
      } else {
        r->fail_reason = what;
      }
      break;
    }
    if (!r->fail_reason.empty() || !r->recover_reason.empty()) continue;
    CompletePhaseLocked(r, phase);
  }
  absl::MutexLock lock(&mu_);
  r->runner_done = true;
}

void JobManager::CompletePhaseLocked(JobRecord* r, const PlannedPhase& phase) {
  const double wall = absl::ToDoubleSeconds(absl::Now() - r->inflight_started);
  CoordinatorMetrics::Global().PhaseCompleted(phase.phase, wall, r->reports);
  if (phase.phase == tandem::v1::PHASE_CHECKPOINT) {
    r->last_checkpoint_seconds = wall;
    // Every rank keeps its neighbour's shard in memory (worker/engine/peer_snapshot.h).
    bool all_copied = r->reports.size() > 1;
    for (const auto& [rank, rep] : r->reports) all_copied = all_copied && rep.checkpoint().peer_copy();
    if (all_copied) {
      r->job.mutable_recovery()->set_peer_copy_step(phase.step);
      r->job.mutable_recovery()->set_peer_copy_world(r->job.worker_ids_size());
    }
  }
  if (r->extra) {  // an unplanned phase: the cursor stays
    r->extra.reset();
    r->inflight.reset();
    r->reports.clear();
    PersistLocked(*r);
    return;
  }
  const int64_t unit = r->cursor.unit;
  if (r->plan->KindOf(unit) == UnitKind::kSetup) {
    CompleteSetupLocked(r, wall);
    return;
  }
  if (r->acc_unit != unit) {
    r->step_acc.Clear();
    r->acc_unit = unit;
  }
  StepMetrics& acc = r->step_acc;
  const auto& rank0 = r->reports.at(0);
  MergeMetrics(&acc, rank0.metrics());
  const std::string name = PhaseName(phase.phase);
  double worker_max = 0;
  int64_t peak = 0;
  for (const auto& [rank, rep] : r->reports) {
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
  r->inflight.reset();
  r->reports.clear();  // rank0 is gone from here on
  PhaseCursor next = r->plan->Next(r->cursor);
  const UnitKind kind = r->plan->KindOf(unit);
  if (kind == UnitKind::kWarmup && held && next.unit <= r->plan->AfterWarmStart().unit) {
    // The warm start reached its skill level (init.sft.stop_accuracy): the
    // model no longer changes, so the remaining steps would only re-check it.
    const int64_t done = -phase.step;
    EventLocked(r, "warm_start",
                absl::StrCat("warm start reached init.sft.stop_accuracy ", r->job.spec().init().sft_stop_accuracy(),
                             " at step ", done, "/", r->job.spec().init().sft_steps(),
                             " (teacher-forced exact ", probe,
                             "); skipping the remaining ", r->job.spec().init().sft_steps() - done));
    next = r->plan->AfterWarmStart();
  }
  r->cursor = next;
  if (phase.phase == tandem::v1::PHASE_SFT_STEP || phase.phase == tandem::v1::PHASE_UPDATE) {
    // What a degraded recovery keeps: every rank has finished this step.
    auto* rec = r->job.mutable_recovery();
    rec->set_has_last_trained(true);
    rec->set_last_trained_step(phase.step);
    rec->set_last_trained_next_unit(next.unit);
    rec->set_last_trained_next_sub(next.sub);
  }
  const bool unit_done = next.unit != unit;
  if (unit_done && (kind == UnitKind::kStep || kind == UnitKind::kWarmup || kind == UnitKind::kBaseline)) {
    acc.set_step(r->plan->StepOf(unit));
    acc.set_wall_time(clock_->WallSeconds());
    if (kind == UnitKind::kWarmup) (*acc.mutable_extra())["warmup"] = 1;
    if (kind == UnitKind::kBaseline) (*acc.mutable_extra())["baseline"] = 1;
    *r->job.mutable_latest() = acc;
    if (kind == UnitKind::kStep) r->job.set_step(acc.step());
    if (kind == UnitKind::kStep) CoordinatorMetrics::Global().StepCompleted(r->job.spec().kind());
    PersistLocked(*r);
    std::string summary = kind == UnitKind::kWarmup ? absl::StrCat("warm-start step ", -acc.step(), "/",
                                                                   r->job.spec().init().sft_steps())
                          : kind == UnitKind::kBaseline ? std::string("baseline evaluation")
                                                        : StepSummary(acc, r->job.total_steps());
    EventLocked(r, "step", summary, &acc);
  } else {
    PersistLocked(*r);
  }
}

void JobManager::CompleteSetupLocked(JobRecord* r, double wall) {
  // Where the plan continues: after the restored checkpoint's step.
  int64_t restored = -1, skipped = 0;
  double restore_s = 0;
  int source = tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
  for (const auto& [rank, rep] : r->reports) {
    const tandem::v1::SetupResult& setup = rep.setup();
    if (rank == 0 && setup.restored()) restored = setup.restored_step();
    restore_s = std::max(restore_s, setup.restore_seconds());
    source = std::max<int>(source, setup.restore_source());
    skipped = std::max(skipped, setup.checkpoints_skipped());
  }
  r->inflight.reset();
  r->reports.clear();
  auto* rec = r->job.mutable_recovery();
  r->cursor = r->plan->Next(r->cursor);
  const bool live = rec->live_restore() && rec->has_last_trained();
  const bool live_inflight = live && rec->has_inflight_trained() && restored == rec->inflight_trained_step();
  const int64_t restored_step = live_inflight ? rec->inflight_trained_step()
                                : live        ? rec->last_trained_step()
                                : restored >= 0 ? restored
                                                : -1;
  if (live) {
    // The survivors kept the state after this training phase: continue
    // right after it (a warm-start step's number is negative).
    r->cursor = live_inflight ? PhaseCursor{rec->inflight_next_unit(), rec->inflight_next_sub()}
                              : PhaseCursor{rec->last_trained_next_unit(), rec->last_trained_next_sub()};
    rec->set_has_last_trained(true);
    rec->set_last_trained_step(restored_step);
    rec->set_last_trained_next_unit(r->cursor.unit);
    rec->set_last_trained_next_sub(r->cursor.sub);
    if (restored_step >= 1) r->job.set_step(std::max(r->job.step(), restored_step));
  } else if (restored_step >= 0) {
    r->cursor = {r->plan->UnitOfStep(restored_step + 1), 0};
    r->job.set_step(restored_step);
    rec->set_has_last_trained(restored_step >= 1);
    rec->set_last_trained_step(restored_step);
    rec->set_last_trained_next_unit(r->cursor.unit);
    rec->set_last_trained_next_sub(0);
  } else {
    rec->set_has_last_trained(false);
  }
  const bool from_peer = source == tandem::v1::RESTORE_SOURCE_PEER;
  const char* from = live ? "live memory" : from_peer ? "peer memory" : restored_step >= 0 ? "disk" : "scratch";
  if (skipped > 0) {
    EventLocked(r, "recovery", absl::StrCat(skipped, " newer checkpoint(s) failed verification; used step ",
                                            restored_step));
  }
  if (rec->started_at() > 0) {
    const double total = clock_->WallSeconds() - rec->started_at();
    const double rendezvous = std::max(0.0, wall - restore_s);
    const int64_t redone =
        live ? 0 : std::max<int64_t>(0, rec->steps_before() - std::max<int64_t>(0, restored_step));
    StepMetrics m;
    m.set_step(std::max<int64_t>(0, restored_step));
    m.set_wall_time(clock_->WallSeconds());
    auto& x = *m.mutable_extra();
    x["recovery_seconds"] = total;
    x["detect_seconds"] = rec->detect_seconds();
    x["wait_seconds"] = rec->wait_seconds();
    x["rendezvous_seconds"] = rendezvous;
    x["restore_seconds"] = restore_s;
    x["restore_source"] = live                ? tandem::v1::RESTORE_SOURCE_LIVE
                          : from_peer         ? tandem::v1::RESTORE_SOURCE_PEER
                          : restored_step >= 0 ? tandem::v1::RESTORE_SOURCE_DISK
                                              : tandem::v1::RESTORE_SOURCE_UNSPECIFIED;
    x["degraded"] = rec->degraded_logical_world() > 0 ? 1 : 0;
    x["steps_redone"] = static_cast<double>(redone);
    x["world_size"] = r->job.worker_ids_size();
    x["generation"] = static_cast<double>(r->job.generation());
    rec->set_steps_redone_total(rec->steps_redone_total() + redone);
    rec->set_started_at(0);
    rec->set_restore_from("");
    rec->set_peer_restore_step(0);
    rec->clear_peer_restore_ranks();
    rec->set_peer_failed(false);
    rec->set_live_restore(false);
    rec->set_live_failed(false);
    rec->set_has_inflight_trained(false);
    r->job.set_state(tandem::v1::JOB_STATE_RUNNING);
    r->job.set_reason("");
    PersistLocked(*r);
    EventLocked(r, "recovery",
                absl::StrFormat("recovered in %.2f s: detect %.2f s, wait %.2f s, rendezvous %.2f s, restore %.2f s "
                                "from %s; resuming at step %d (%d step%s redone)",
                                total, rec->detect_seconds(), rec->wait_seconds(), rendezvous, restore_s, from,
                                std::max<int64_t>(0, restored_step) + 1, redone, redone == 1 ? "" : "s"),
                &m);
    EventLocked(r, "state", "job running");
    return;
  }
  PersistLocked(*r);
  EventLocked(r, "state", restored_step >= 0 ? absl::StrFormat("setup done on every worker; resumed from step %d "
                                                               "(%s), continuing at step %d",
                                                               restored_step, from, restored_step + 1)
                                             : std::string("setup done on every worker"));
}


}  // namespace tandem::server
