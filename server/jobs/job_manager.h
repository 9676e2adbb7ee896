// JobManager: the job registry and the job drivers.
//
// Where each part lives:
//   job_manager.cc   registry (submit, get, list, cancel, events, logs),
//                    retention, the scheduler thread
//   job_driver.cc    one driver thread per running job: issues the phases,
//                    takes the reports, completes phases and the job
//   job_recovery.cc  the recovery state machine (losses, preemption, grow
//                    back, degraded continuation)
//   phase_plan.h, phase_commands.h, step_metrics.h: pure functions it uses;
//   server/recovery/policy.h: the pure recovery decisions.
//
// Registry: submit (validated, defaults filled, persisted PENDING), get,
// list, cancel, events (WatchJob) and logs. Scheduler thread: gang-schedules
// PENDING jobs onto idle workers (scheduler.h). Driver: one thread per
// running job issues the job's PhasePlan phase by phase through the
// workers' command queues (membership.h), waits for every rank's
// ReportPhase (per-phase timeout), records per-phase wall time and peak
// memory, persists the cursor after every phase, and emits "step" events.
// Each job stores at most kMaxEventsPerJob events and kMaxLogLinesPerJob log
// lines (job_limits.h); finished jobs go by the retention settings.
//
// Command ids are deterministic (phase_commands.h): a phase re-issued after
// a coordinator restart or a re-attach carries the same id, and a worker
// that already ran it answers from its cached report.
// A failed phase fails the job with a reason naming the step, phase, worker
// and rank. Shutdown() stops the drivers without changing job states: a
// restarted coordinator continues from the cursor.
//
// Recovery (policy in server/recovery/policy.h): a lost worker (lease expired,
// re-registered without the job's state), a failure of kind RETRYABLE
// reported by any rank (ReportPhaseRequest.failure), or
// a phase timeout puts the job RECOVERING: generation += 1, every old
// member is told abort_job, the driver waits (replacement timeout) for the
// survivors plus idle replacements - or continues with fewer ranks when
// cluster.min_workers allows - then re-issues SETUP to every rank with the
// restore source (peer memory when possible, else the newest recorded disk
// checkpoint, else scratch) and continues the plan after the restored step
// (SETUP's result.restored_step). A restore that fails marks that source
// bad and recovers again with the next one. Preempting workers (heartbeat
// `preempting`) are handed over at the next step boundary after a
// checkpoint when it fits the budget. Events of kind "recovery" carry the
// durations (detect, wait, rendezvous, restore) in metrics.extra.
// Degraded jobs (recovery.degraded, MeCeFO) do not wait or roll back: the
// survivors keep their live state and compute the lost ranks' data shares.
// A job below cluster.workers (degraded or elastic) grows back at a step
// boundary when idle workers exist: checkpoint, flush, recovery from it.
//
// Locking: mu_ guards all job records. Lock order, one direction only:
// JobManager::mu_ -> Membership's, KvStore's and StateStore's own mutexes;
// those never call back into JobManager (the coordinator's reaper thread
// hands Membership's expired leases over after Membership's lock is released). StateStore writes (SQLite, fsync)
// happen under mu_ today, so one job's write delays the others' reports.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "server/store/kv_store.h"
#include "server/membership/membership.h"
#include "server/jobs/phase_plan.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/config.pb.h"
#include "tandem/v1/control.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

bool IsTerminal(tandem::v1::JobState state);
std::string JobStateName(tandem::v1::JobState state);  // "running"

class JobManager {
 public:
  JobManager(const tandem::v1::CoordinatorConfig& config, StateStore* store, Membership* membership, KvStore* kv,
             const Clock* clock);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Reloads every job from the store (call before Start).
  absl::Status Load();
  // Starts the scheduler thread and the drivers of reloaded RUNNING jobs.
  void Start();
  // Stops every thread (bounded by the drivers' wait granularity); job
  // states stay as persisted.
  void Shutdown();

  // Submit and Cancel fail (UNAVAILABLE, nothing changed) when the state
  // store cannot persist them.
  absl::StatusOr<tandem::v1::Job> Submit(tandem::v1::JobSpec spec);
  absl::StatusOr<tandem::v1::Job> Get(const std::string& job_id) const;
  std::vector<tandem::v1::Job> List(tandem::v1::JobState filter, int limit) const;
  absl::StatusOr<tandem::v1::Job> Cancel(const std::string& job_id, const std::string& reason);

  // Events after `after_seq`, waiting up to wait_ms for one to come.
  // *finished: the job is terminal and every event was returned.
  absl::Status NextEvents(const std::string& job_id, int64_t after_seq, int64_t wait_ms,
                          std::vector<StoredEvent>* out, bool* finished);
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id) const;
  absl::StatusOr<std::vector<tandem::v1::LogLine>> Logs(const std::string& job_id, int64_t after_seq,
                                                        int limit) const;
  absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> Checkpoints(const std::string& job_id) const;

  // "" while the state store takes writes; else the last write error (the
  // coordinator is then not ready: /readyz says so).
  std::string StoreError() const;

  // From the Cluster service.
  absl::Status OnReport(const tandem::v1::ReportPhaseRequest& report);
  void OnWorkerLost(const LostWorker& lost);
  void OnWorkerAttached(const std::string& worker_id);
  // A worker asked to leave (SIGTERM): handed over at the next step boundary.
  void OnWorkerPreempting(const std::string& worker_id, const std::string& job_id);
  // Generation of job_id when it is running with worker_id in it, else -1.
  int64_t JobGenerationFor(const std::string& job_id, const std::string& worker_id) const;
  // True when (job, generation) names a running job's current generation.
  bool ScopeActive(const std::string& job_id, int64_t generation) const;
  void NotifyScheduler();

  std::vector<tandem::v1::Job> Snapshot() const;
  bool loaded() const;

 private:
  struct JobRecord {
    tandem::v1::Job job;
    PhaseCursor cursor;
    int64_t seq = 0;
    std::unique_ptr<PhasePlan> plan;
    std::optional<tandem::v1::PhaseCommand> inflight;
    absl::Time inflight_started;
    std::map<int, tandem::v1::ReportPhaseRequest> reports;  // by rank
    std::string fail_reason;
    bool cancel_requested = false;
    std::string cancel_reason;
    int64_t last_event_seq = 0;
    int64_t log_lines = 0;
    tandem::v1::StepMetrics step_acc;
    int64_t acc_unit = -1;
    std::thread runner;
    bool runner_done = false;
    // Recovery (job_recovery.cc).
    std::string recover_reason;        // non-empty: the driver recovers next
    double recover_requested_at = 0;   // wall seconds
    std::set<std::string> suspects;    // members to replace
    bool choosing_members = false;     // inside RecoverLocked's wait
    std::set<std::string> preempting;  // members that asked to leave
    std::map<std::string, int> restore_losses;  // workers lost while restoring each checkpoint
    int64_t preempt_checkpoint_step = -1;
    int64_t preempt_flush_step = -1;
    std::optional<PlannedPhase> extra;  // an unplanned phase issued before the cursor's
    double last_checkpoint_seconds = 0;
    // Growing back (an elastic or degraded job below cluster.workers with
    // idle workers around): checkpoint, flush, then a planned recovery.
    bool grow_back = false;            // the pending recovery is a grow back
    int grow_target = 0;               // ranks to grow to
    int64_t grow_checkpoint_step = -1;
    int64_t grow_flush_step = -1;
  };

  void SchedulerLoop();
  void ScheduleOnce();
  void StartRunnerLocked(JobRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunJob(JobRecord* r);
  void CompletePhaseLocked(JobRecord* r, const PlannedPhase& phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteSetupLocked(JobRecord* r, double wall) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the driver to recover; `suspect` (may be empty) is replaced.
  void RequestRecoveryLocked(JobRecord* r, const std::string& reason, const std::string& suspect)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one recovery on the driver thread (waits with mu_ released).
  void RecoverLocked(JobRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a step boundary with a preempting member: checkpoint or hand over.
  bool HandlePreemptionLocked(JobRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a step boundary of a job below full size with idle workers around:
  // checkpoint + flush, then a recovery onto more ranks (true: requested).
  bool HandleGrowBackLocked(JobRecord* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Degraded continuation (RecoverySpec.degraded): the survivors continue
  // at once with the lost ranks' shares; false when not possible.
  bool RecoverDegradedLocked(JobRecord* r, const std::vector<std::string>& old_ids,
                             const std::set<std::string>& survivors) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordCheckpointLocked(JobRecord* r, int64_t generation, const tandem::v1::PublishedCheckpoint& published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(JobRecord* r, tandem::v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistLocked(const JobRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION when the job's memory estimate per worker exceeds
  // the largest registered worker of its device (OK when none is known).
  absl::Status CheckMemoryFits(const tandem::v1::JobSpec& spec) const;
  // Deletes finished jobs past max_finished_jobs / finished_job_retention_s.
  void PruneFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers a store write's outcome for StoreError().
  void NoteStoreWrite(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EventLocked(JobRecord* r, const std::string& kind, const std::string& message,
                   const tandem::v1::StepMetrics* metrics = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogLocked(JobRecord* r, const std::string& source, const std::vector<std::string>& lines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRecord* FindLocked(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const tandem::v1::CoordinatorConfig config_;
  StateStore* const store_;
  Membership* const membership_;
  KvStore* const kv_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::string store_error_ ABSL_GUARDED_BY(mu_);
  double last_prune_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar changed_;  // reports, cancels, failures, events, stop
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = true;
  std::thread scheduler_;
};

}  // namespace tandem::server
