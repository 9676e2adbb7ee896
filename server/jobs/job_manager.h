// JobManager: the job registry. One JobDriver per job (job_driver.h) holds
// the job's record and runs its driver thread while it runs.
//
// Registry: submit (validated, defaults filled, persisted PENDING), get,
// list, cancel, events (WatchJob) and logs; retention of finished jobs
// (max_finished_jobs, finished_job_retention_s). Scheduler thread:
// gang-schedules PENDING jobs onto idle workers (scheduler.h) and starts
// their drivers. Reports, losses, preemptions and re-attaches are handed to
// the job's driver after a brief lookup.
// Each job stores at most kMaxEventsPerJob events and kMaxLogLinesPerJob log
// lines (job_limits.h).
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
// Locking: mu_ (the registry lock) guards the map of drivers and the
// scheduler's flags; it is held only for lookups and map changes, never
// across a driver's lock, a Membership call or a StateStore (SQLite) call.
// store_mu_ guards the last store error (a leaf). Lock order, one direction
// only: JobDriver::mu_ -> JobManager::mu_ -> Membership, KvStore,
// StateStore locks; store_mu_ is taken alone. A SQLite write for one job
// runs under that job's driver lock only, so it never blocks another job's
// reports. Membership never calls back into JobManager (the coordinator's
// reaper thread hands expired leases over after Membership's lock is
// released). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "server/jobs/job_driver.h"
#include "server/membership/membership.h"
#include "server/store/kv_store.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/config.pb.h"
#include "tandem/v1/control.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

class JobManager : public DriverHost {
 public:
  JobManager(const tandem::v1::CoordinatorConfig& config, StateStore* store, Membership* membership, KvStore* kv,
             const Clock* clock);
  ~JobManager() override;
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
  absl::Status NextEvents(const std::string& job_id, int64_t after_seq, int64_t wait_ms, std::vector<StoredEvent>* out,
                          bool* finished);
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id) const;
  absl::StatusOr<std::vector<tandem::v1::LogLine>> Logs(const std::string& job_id, int64_t after_seq, int limit) const;
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

  // DriverHost.
  void RequestSchedule() override;
  void NoteStoreWrite(const absl::Status& s) override;

  // Tests: the job's driver (null when unknown).
  std::shared_ptr<JobDriver> DriverForTest(const std::string& job_id) const { return Find(job_id); }

 private:
  std::shared_ptr<JobDriver> Find(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<JobDriver>> FindOrNotFound(const std::string& job_id) const;
  std::vector<std::shared_ptr<JobDriver>> Drivers() const;
  void SchedulerLoop();
  void ScheduleOnce();
  // FAILED_PRECONDITION when the job's memory estimate per worker exceeds
  // the largest registered worker of its device (OK when none is known).
  absl::Status CheckMemoryFits(const tandem::v1::JobSpec& spec) const;
  // Deletes finished jobs past max_finished_jobs / finished_job_retention_s.
  void PruneFinished();

  const tandem::v1::CoordinatorConfig config_;
  StateStore* const store_;
  Membership* const membership_;
  KvStore* const kv_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<JobDriver>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool loaded_ ABSL_GUARDED_BY(mu_) = false;
  bool schedule_requested_ ABSL_GUARDED_BY(mu_) = true;
  double last_prune_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread scheduler_;

  mutable absl::Mutex store_mu_;
  std::string store_error_ ABSL_GUARDED_BY(store_mu_);
};

}  // namespace tandem::server
