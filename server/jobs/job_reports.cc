// JobDriver: the ranks' reports of the phase in flight, the checkpoints
// they publish, and re-sending the phase to a worker that re-attached
// (job_driver.h).
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
#include "server/recovery/checkpoint_catalogue.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using tandem::v1::JobState;
using tandem::v1::StepMetrics;

absl::Status JobDriver::OnReport(const tandem::v1::ReportPhaseRequest& report) {
  WriteTicket acknowledge_after = 0;
  absl::Status s;
  {
    absl::MutexLock lock(&mu_);
    s = OnReportLocked(report, &acknowledge_after);
  }
  // A published checkpoint is acknowledged once its record is durable (the
  // worker does not send it again); the wait holds no lock.
  if (acknowledge_after == 0) return s;
  absl::Status durable = store_->WaitDurable(acknowledge_after, absl::Now() + kCheckpointAckWait);
  host_->NoteStoreWrite(durable);
  if (!durable.ok()) {
    return absl::UnavailableError(
        absl::StrCat("checkpoint record of job ", id_, " not stored yet (", durable.message(), "): send it again"));
  }
  return s;
}

absl::Status JobDriver::OnReportLocked(const tandem::v1::ReportPhaseRequest& report, WriteTicket* acknowledge_after) {
  const auto& ids = job_.worker_ids();
  auto it = std::find(ids.begin(), ids.end(), report.worker_id());
  // Nothing in a report is used before its sender is known to be a member.
  if (it == ids.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", report.worker_id(), " is not part of job ", report.job_id()));
  }
  const std::string& root = job_.spec().checkpoint().dir();
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
  if (!IsTerminal(job_.state())) {
    for (const auto& published : report.checkpoints()) {
      *acknowledge_after = std::max(*acknowledge_after, RecordCheckpointLocked(report.generation(), published));
    }
  }
  const int rank = static_cast<int>(it - ids.begin());
  std::vector<std::string> lines(report.log_lines().begin(), report.log_lines().end());
  LogLocked(absl::StrCat("rank", rank), lines);
  if (IsTerminal(job_.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_.id(), " is ", JobStateName(job_.state()), ": drop its state"));
  }
  if (report.generation() != job_.generation()) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", report.generation(), " is stale; job ", job_.id(),
                                                      " is at generation ", job_.generation()));
  }
  if (!inflight_ || inflight_->command_id() != report.command_id()) {
    spdlog::debug("job {}: ignoring report for {} (not in flight)", job_.id(), report.command_id());
    return absl::OkStatus();
  }
  if (reports_.count(rank)) return absl::OkStatus();  // duplicate (re-sent command)
  reports_[rank] = report;
  // A communicator failure (a peer died, a collective timed out or was
  // aborted) is the cluster's, not the job's: recover without waiting for
  // the other ranks, which may hang on the dead peer until aborted.
  if (common::ReportFailureKind(report) == tandem::v1::PHASE_FAILURE_KIND_RETRYABLE) {
    RequestRecoveryLocked(absl::StrCat(report.step() != 0 ? absl::StrCat("step ", report.step(), " ") : "", "phase ",
                                       PhaseUpperName(report.phase()), " failed on worker ", report.worker_id(),
                                       " (rank ", rank, "): ", report.error()),
                          "");
  }
  return absl::OkStatus();
}

WriteTicket JobDriver::RecordCheckpointLocked(int64_t generation, const tandem::v1::PublishedCheckpoint& published) {
  tandem::v1::CheckpointRecord rec;
  rec.set_job_id(job_.id());
  rec.set_step(published.step());
  rec.set_path(published.path());
  rec.set_generation(generation);
  rec.set_world_size(job_.worker_ids_size());
  rec.set_bytes(published.bytes());
  rec.set_time(clock_->WallSeconds());
  const std::string key = absl::StrCat(rec.step(), "/", rec.generation(), "/", rec.path());
  if (recorded_checkpoints_.count(key)) return write_ticket_;  // recorded already (maybe not committed yet)
  // Rank 0 applies checkpoint.keep right after publishing: the catalogue
  // lists only what is still on disk.
  auto added = CatalogueLocked().Record(rec, job_.spec().checkpoint().keep());
  host_->NoteStoreWrite(added.status());
  if (!added.ok()) {
    spdlog::error("job {} checkpoint record: {}", id_, added.status().ToString());
    return 0;
  }
  if (recorded_checkpoints_.size() >= kMaxCheckpointRecordsPerJob) recorded_checkpoints_.clear();
  recorded_checkpoints_.insert(key);
  if (*added == 0) return 0;  // recorded already
  write_ticket_ = *added;
  CoordinatorMetrics::Global().CheckpointPublished(published.bytes());
  EventLocked("checkpoint", absl::StrCat("checkpoint of step ", rec.step(), " at ", rec.path()));
  return write_ticket_;
}

void JobDriver::OnWorkerAttached(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  {
    if ((job_.state() != tandem::v1::JOB_STATE_RUNNING && job_.state() != tandem::v1::JOB_STATE_RECOVERING) ||
        !inflight_ || !inflight_sent_) {
      return;
    }
    const auto& ids = job_.worker_ids();
    auto it = std::find(ids.begin(), ids.end(), worker_id);
    if (it == ids.end()) return;
    int rank = static_cast<int>(it - ids.begin());
    if (!reports_.count(rank)) {
      membership_->Resend(worker_id,
                          CommandForRank(job_, state_, *inflight_, rank, config_.runs_dir(), RankNodesLocked()));
    }
  }
}

}  // namespace tandem::server
