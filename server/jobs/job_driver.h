// JobDriver: one job's record and, while the job runs, its driver thread.
//
// Each job has one JobDriver (owned by the registry, JobManager). It holds
// the job's user-facing record (Job), its own persisted DriverState (phase
// cursor, restore sources, recovery cursors; driver_state.proto, never sent
// to clients), the phase plan, the phase in flight with the ranks' reports,
// and the in-memory recovery bookkeeping. While the
// job is RUNNING or RECOVERING the driver's thread (owned and joined by the
// driver) issues the PhasePlan phase by phase through the workers' command
// queues (membership.h), waits for every rank's ReportPhase (per-phase
// timeout), records per-phase wall time and peak memory, persists the
// cursor after every phase, and emits "step" events.
//
// Where each part lives:
//   job_driver.cc    lifecycle (start, stop, cancel), the record's accessors,
//                    events, logs, persistence, the job's end
//   job_run.cc       the driver loop and phase completion
//   job_reports.cc   reports and checkpoints published by the ranks
//   job_recovery.cc  the recovery state machine (losses, preemption, grow
//                    back, degraded continuation): it waits and sends, and
//                    applies the steps of server/recovery/recovery_controller.h
//                    and the job's CheckpointCatalogue to the typed state
//
// Locking: mu_ guards the job's state and is the job's lock. view_mu_ (a
// leaf) guards view_, a copy of the Job published before every persist and
// event: Record(), State(), Finished() and HasMember() read only the view, so
// listing jobs never waits for a job's lock. Lock order, one direction
// only: JobDriver::mu_ -> JobManager's registry lock
// (DriverHost::RequestSchedule) -> Membership, KvStore and StateStore locks;
// view_mu_ is taken last. The thread waits on mu_ with absl conditions
// (reports, cancels, failures, recovery requests, stop): those are
// re-evaluated whenever mu_ is released, so nothing else is signalled.
//
// Persistence: the job's writes (its row with the DriverState, events,
// logs, checkpoint records) are queued on the StateStore's writer under mu_
// and never wait there. The driver waits for durability (StateStore::
// WaitDurable, see the invariant in state_store.h) with mu_ released, and
// only before a side effect that depends on the write: its thread before
// sending the phase command at a new cursor, PersistNew and Cancel before
// they answer, OnReport before it acknowledges a published checkpoint. So a
// slow write anywhere never holds a job's lock: the job's reports, Cancel,
// WatchJob and the reaper are answered meanwhile; only the job's next
// command waits for its own write, in its own thread.
// Thread-safe; every public method takes the locks it needs.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/clock.h"
#include "server/jobs/phase_plan.h"
#include "server/membership/membership.h"
#include "server/recovery/checkpoint_catalogue.h"
#include "server/store/kv_store.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/config.pb.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

bool IsTerminal(tandem::v1::JobState state);
std::string JobStateName(tandem::v1::JobState state);  // "running"

// What a driver needs from its registry. Both calls take only the
// registry's own short locks (never a driver's).
class DriverHost {
 public:
  virtual ~DriverHost() = default;
  // A job finished or freed its workers: the scheduler looks again.
  virtual void RequestSchedule() = 0;
  // Remembers a state-store write's outcome (readiness).
  virtual void NoteStoreWrite(const absl::Status& s) = 0;
};

// The services every driver uses; they outlive the drivers.
struct DriverServices {
  const tandem::v1::CoordinatorConfig* config = nullptr;
  StateStore* store = nullptr;
  Membership* membership = nullptr;
  KvStore* kv = nullptr;
  const Clock* clock = nullptr;
  DriverHost* host = nullptr;
};

class JobDriver {
 public:
  // A new job (PENDING, not yet persisted) or one loaded from the store.
  JobDriver(const DriverServices& services, tandem::v1::Job job, int64_t seq);
  JobDriver(const DriverServices& services, StoredJob stored);
  // Stops and joins the thread.
  ~JobDriver();
  JobDriver(const JobDriver&) = delete;
  JobDriver& operator=(const JobDriver&) = delete;

  const std::string& id() const { return id_; }
  int64_t seq() const { return seq_; }

  // Loading: the stored spec and state are checked; a job that cannot run
  // is failed ("quarantined") with the reason. Reads the event and log
  // counters from the store.
  absl::Status LoadCounters();
  void QuarantineIfInvalid();
  // Start(): a reloaded RUNNING/RECOVERING job's driver thread starts.
  void Resume();
  // Persists a new job (UNAVAILABLE when the store cannot) and records the
  // "submitted" event.
  absl::Status PersistNew(const std::string& submitted_message);
  // The scheduler placed a PENDING job on `worker_ids`: assign, persist,
  // start the thread. False when the job is no longer PENDING or the
  // assignment failed.
  bool StartOn(const std::vector<std::string>& worker_ids);
  // The scheduler's reason a PENDING job waits.
  void SetPendingReason(const std::string& reason);
  absl::StatusOr<tandem::v1::Job> Cancel(const std::string& reason);
  // Stops the thread without changing the job's state (coordinator shutdown).
  void Stop();
  // Joins a thread that has finished (the scheduler's housekeeping).
  void ReapThread();
  // Terminal and no thread running: retention may delete it.
  bool Finished() const;

  // The job as last published (never waits for mu_).
  tandem::v1::Job Record() const;
  tandem::v1::JobState State() const;
  bool HasMember(const std::string& worker_id) const;
  int64_t LastEventSeq() const;
  // Waits up to `wait` for an event after `after_seq` (or Stop); returns the
  // last event seq and whether the job is terminal.
  void AwaitEvent(int64_t after_seq, absl::Duration wait, int64_t* last, bool* terminal);
  // Generation when running with worker_id in it, else -1.
  int64_t GenerationFor(const std::string& worker_id) const;
  bool ScopeActive(int64_t generation) const;

  // From the Cluster service and the reaper.
  absl::Status OnReport(const tandem::v1::ReportPhaseRequest& report);
  // The reaper's hand-over: the loss goes into the driver's inbox (a leaf
  // lock) and the call returns at once, even while the job's lock is held;
  // the driver thread handles it at its next wake-up (at most
  // kInboxPollInterval later).
  void OnWorkerLost(const LostWorker& lost);
  void OnWorkerAttached(const std::string& worker_id);
  void OnWorkerPreempting(const std::string& worker_id);

  // Tests: holds the job's lock until `release` (bounded), notifying `held`
  // once taken: stands for a driver stuck under its lock.
  void HoldLockForTest(absl::Notification* held, absl::Notification* release);
  // Losses posted and not yet taken by the driver thread.
  size_t InboxSizeForTest() const;

 private:
  // Takes the inbox's losses (HandleLostLocked each); true when there were.
  bool DrainInboxLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleLostLocked(const LostWorker& lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();
  // Waits (no lock held) until `ticket` is durable; false when the driver
  // stops meanwhile.
  bool AwaitDurableBeforeSend(WriteTicket ticket);
  void CompletePhaseLocked(const PlannedPhase& phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteSetupLocked(double wall) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the driver to recover; `suspect` (may be empty) is replaced.
  void RequestRecoveryLocked(const std::string& reason, const std::string& suspect) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one recovery on the driver thread (waits with mu_ released).
  void RecoverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a step boundary with a preempting member: checkpoint or hand over.
  bool HandlePreemptionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a step boundary of a job below full size with idle workers around:
  // checkpoint + flush, then a recovery onto more ranks (true: requested).
  bool HandleGrowBackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Degraded continuation (RecoverySpec.degraded): the survivors continue
  // at once with the lost ranks' shares; false when not possible.
  bool RecoverDegradedLocked(const std::vector<std::string>& old_ids, const std::set<std::string>& survivors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the record and its event; the ticket to wait for before the
  // publication is acknowledged (0: recorded already, or not recorded).
  WriteTicket RecordCheckpointLocked(int64_t generation, const tandem::v1::PublishedCheckpoint& published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OnReportLocked(const tandem::v1::ReportPhaseRequest& report, WriteTicket* acknowledge_after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `ticket` with mu_ released (and taken again); the outcome is
  // noted for readiness.
  absl::Status AwaitDurableLocked(WriteTicket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(tandem::v1::JobState state, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the job and its driver state (write_ticket_); an error is logged
  // and noted for readiness. SaveLocked: the same where the caller goes on
  // anyway.
  absl::Status PersistLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's checkpoints and bad restore sources (its bad list is state_'s).
  CheckpointCatalogue CatalogueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return CheckpointCatalogue(store_, id_, &state_);
  }
  void SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { PersistLocked().IgnoreError(); }
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node of each rank (empty when a worker is unknown): the SETUP
  // assignment's topology.
  std::vector<std::string> RankNodesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EventLocked(const std::string& kind, const std::string& message,
                   const tandem::v1::StepMetrics* metrics = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogLocked(const std::string& source, const std::vector<std::string>& lines) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const tandem::v1::CoordinatorConfig& config_;
  StateStore* const store_;
  Membership* const membership_;
  KvStore* const kv_;
  const Clock* const clock_;
  DriverHost* const host_;
  const std::string id_;
  const int64_t seq_;  // submission order

  mutable absl::Mutex view_mu_ ABSL_ACQUIRED_AFTER(mu_);

  // The inbox (a leaf: taken alone, or last under mu_).
  mutable absl::Mutex inbox_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<LostWorker> lost_inbox_ ABSL_GUARDED_BY(inbox_mu_);
  std::atomic<bool> inbox_pending_{false};
  tandem::v1::Job view_ ABSL_GUARDED_BY(view_mu_);

  mutable absl::Mutex mu_;
  tandem::v1::Job job_ ABSL_GUARDED_BY(mu_);  // what users see
  // The driver's own persisted state (restore sources, recovery cursors);
  // its cursor fields are written from cursor_ when persisted.
  tandem::v1::DriverState state_ ABSL_GUARDED_BY(mu_);
  PhaseCursor cursor_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PhasePlan> plan_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<tandem::v1::PhaseCommand> inflight_ ABSL_GUARDED_BY(mu_);
  absl::Time inflight_started_ ABSL_GUARDED_BY(mu_);
  std::map<int, tandem::v1::ReportPhaseRequest> reports_ ABSL_GUARDED_BY(mu_);  // by rank
  std::string fail_reason_ ABSL_GUARDED_BY(mu_);
  bool cancel_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::string cancel_reason_ ABSL_GUARDED_BY(mu_);
  int64_t last_event_seq_ ABSL_GUARDED_BY(mu_) = 0;
  WriteTicket last_event_ticket_ ABSL_GUARDED_BY(mu_) = 0;  // the write of event last_event_seq_
  WriteTicket write_ticket_ ABSL_GUARDED_BY(mu_) = 0;       // the job's last queued write
  // The phase in flight has been sent (its state was durable by then).
  bool inflight_sent_ ABSL_GUARDED_BY(mu_) = false;
  // Checkpoints recorded by this driver (step/generation/path), so a
  // publication repeated by another rank before the record is committed is
  // recorded once.
  std::set<std::string> recorded_checkpoints_ ABSL_GUARDED_BY(mu_);
  int64_t log_lines_ ABSL_GUARDED_BY(mu_) = 0;
  tandem::v1::StepMetrics step_acc_ ABSL_GUARDED_BY(mu_);
  int64_t acc_unit_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  bool thread_done_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> running_{false};   // the thread has not finished Run()
  std::atomic<bool> reapable_{false};  // finished and not joined yet
  // Recovery (job_recovery.cc).
  std::string recover_reason_ ABSL_GUARDED_BY(mu_);                 // non-empty: the driver recovers next
  double recover_requested_at_ ABSL_GUARDED_BY(mu_) = 0;            // wall seconds
  std::set<std::string> suspects_ ABSL_GUARDED_BY(mu_);             // members to replace
  bool choosing_members_ ABSL_GUARDED_BY(mu_) = false;              // inside RecoverLocked's wait
  std::set<std::string> preempting_ ABSL_GUARDED_BY(mu_);           // members that asked to leave
  std::map<std::string, int> restore_losses_ ABSL_GUARDED_BY(mu_);  // workers lost restoring each checkpoint
  int64_t preempt_checkpoint_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t preempt_flush_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<PlannedPhase> extra_ ABSL_GUARDED_BY(mu_);  // an unplanned phase issued before the cursor's
  double last_checkpoint_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  // Growing back (an elastic or degraded job below cluster.workers with
  // idle workers around): checkpoint, flush, then a planned recovery.
  bool grow_back_ ABSL_GUARDED_BY(mu_) = false;  // the pending recovery is a grow back
  int grow_target_ ABSL_GUARDED_BY(mu_) = 0;     // ranks to grow to
  int64_t grow_checkpoint_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t grow_flush_step_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace tandem::server
