// Membership: registered workers, their leases, their command queues (what
// the Attach stream delivers) and their assignment to jobs.
//
// - Register: the same worker_id, or else the same name, keeps its id; a
//   re-register replaces the previous Attach stream (the old one ends).
//   Each registration gets a credential (a random secret; only its digest
//   is kept, also in the store). While a worker is live (lease valid) its
//   name and id go only to a caller presenting that credential, so a second
//   worker with the same name is refused instead of taking over.
// - Heartbeat renews the lease; ExpireLeases() marks workers whose lease ran
//   out LOST and returns them (the caller tells their jobs). Time the checker
//   itself was held up (the coordinator stalled, so heartbeats waited
//   unanswered) does not count against leases.
// - A command queued for a worker goes to its current Attach stream only: a
//   superseded stream never takes one from the queue, and a command a stream
//   could not write goes back to the front of the queue.
// - Drain: the worker takes no new job; it is told to drain once idle.
// Worker records are queued on the state store's writer under mu_ and never
// waited for there; Register answers only once the new credential's digest
// is durable (waiting with mu_ released).
// Never calls out to other managers (no lock-order cycles): results are
// returned to the caller. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/config.pb.h"

namespace tandem::server {

// Commands for one worker, consumed by its Attach stream. The queue knows
// the worker's current attach epoch (set by Membership), so only the current
// stream takes commands from it. Thread-safe.
class CommandQueue {
 public:
  enum class PopResult { kCommand, kTimeout, kSuperseded };

  void Push(tandem::v1::WorkerCommand command);
  // Waits up to timeout_ms for a command while `epoch` is the current attach
  // epoch. kSuperseded (queue untouched) once a newer attach or registration
  // took over, also while waiting. *clears (optional) is for Unpop.
  PopResult Pop(uint64_t epoch, int64_t timeout_ms, tandem::v1::WorkerCommand* out, uint64_t* clears = nullptr);
  // Puts back at the front a command Pop returned but the stream could not
  // write, unless the queue was cleared since (`clears` from that Pop).
  void Unpop(tandem::v1::WorkerCommand command, uint64_t clears);
  void SetEpoch(uint64_t epoch);
  bool ContainsCommand(const std::string& command_id) const;
  void Clear();
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::deque<tandem::v1::WorkerCommand> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clears_ ABSL_GUARDED_BY(mu_) = 0;
};

struct RegisterResult {
  std::string worker_id;
  std::string credential;  // the worker's secret (new, or the one it proved)
  bool keep_job = false;
  // A job the coordinator had this worker in, which the worker no longer
  // holds (it restarted): the caller must tell the job it lost the worker.
  std::string dropped_job;
  int rank = -1;
};

struct LostWorker {
  std::string worker_id;
  std::string name;
  std::string job_id;
  int rank = -1;
  std::string reason;
};

class Membership {
 public:
  Membership(const tandem::v1::CoordinatorConfig& config, StateStore* store, const Clock* clock);

  // Loads workers from the store: LOST/GONE stay so; others get a lease of
  // reattach_grace_ms to come back.
  absl::Status Load();

  // `job_generation` returns the current generation of a job when the job
  // still runs with this worker (-1 otherwise); used to decide keep_job.
  absl::StatusOr<RegisterResult> Register(const tandem::v1::RegisterWorkerRequest& request, int64_t job_generation);
  // OK when `credential` is the one Register issued to worker_id; else
  // UNAUTHENTICATED (none), NOT_FOUND (unknown or lost: re-register) or
  // PERMISSION_DENIED (another worker's, or a superseded one).
  absl::Status CheckCredential(const std::string& worker_id, const std::string& credential) const;
  // The live worker `credential` belongs to.
  absl::StatusOr<std::string> WorkerForCredential(const std::string& credential) const;
  // NOT_FOUND when the coordinator does not know the worker (re-register).
  absl::Status Heartbeat(const tandem::v1::HeartbeatRequest& request);
  // Marks the worker attached; returns its queue and an attach epoch. A
  // later Attach (or Register) of the same worker bumps the epoch.
  absl::StatusOr<std::pair<std::shared_ptr<CommandQueue>, uint64_t>> Attach(const std::string& worker_id);
  void Detach(const std::string& worker_id, uint64_t epoch);
  bool IsCurrentAttach(const std::string& worker_id, uint64_t epoch) const;

  absl::Status Send(const std::string& worker_id, tandem::v1::WorkerCommand command);
  // Re-sends `command` unless it is still queued (after a re-attach).
  void Resend(const std::string& worker_id, const tandem::v1::WorkerCommand& command);

  std::vector<tandem::v1::WorkerInfo> List() const;
  absl::StatusOr<tandem::v1::WorkerInfo> Get(const std::string& worker_id) const;
  absl::StatusOr<tandem::v1::WorkerInfo> Drain(const std::string& id_or_name);
  // IDLE, attached workers with a valid lease.
  std::vector<tandem::v1::WorkerInfo> Idle() const;
  // Assigns all or none (each must be idle): BUSY, job, rank = index.
  absl::Status Assign(const std::string& job_id, const std::vector<std::string>& worker_ids);
  // BUSY -> IDLE for workers still in job_id (DRAINING/LOST stay).
  void Release(const std::string& job_id, const std::vector<std::string>& worker_ids);
  // Called every few hundred ms. A call that comes later than
  // max(lease_ms / 4, 2 * heartbeat_ms) after the previous one (the
  // coordinator was descheduled, or waited for this lock) first moves every
  // lease deadline on by that gap and expires none: the heartbeats that
  // waited meanwhile in the RPC queue get their turn.
  std::vector<LostWorker> ExpireLeases();

  // Recovery.
  // True when the worker is attached with a valid lease and still in job_id.
  bool InJobAndAlive(const std::string& worker_id, const std::string& job_id) const;
  // Makes worker_ids (index = rank) the members of job_id: each must be IDLE
  // or already in job_id (all or none); they become BUSY (DRAINING stays).
  absl::Status Reassign(const std::string& job_id, const std::vector<std::string>& worker_ids);
  // Graceful preemption: the worker leaves at its job's next step boundary
  // (DRAINING, so no job takes it again). Returns its job ("" when idle:
  // then it is told to drain at once).
  std::string MarkPreempting(const std::string& worker_id);
  // The job the worker is in ("" when none or unknown).
  std::string JobOf(const std::string& worker_id) const;
  std::map<tandem::v1::WorkerState, int> CountByState() const;

 private:
  struct Entry {
    tandem::v1::WorkerInfo info;
    int64_t lease_deadline_ms = 0;
    std::shared_ptr<CommandQueue> queue = std::make_shared<CommandQueue>();
    uint64_t attach_epoch = 0;
    bool attached = false;
    std::string credential_digest;
  };
  // Not LOST/GONE and its lease has not run out.
  bool LiveLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& id_or_name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the worker's record; its ticket (0 when not queued).
  WriteTicket Persist(const tandem::v1::WorkerInfo& info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<RegisterResult> RegisterLocked(const tandem::v1::RegisterWorkerRequest& request,
                                                int64_t job_generation, WriteTicket* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const tandem::v1::CoordinatorConfig config_;
  StateStore* const store_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_lease_check_ms_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none yet
};

}  // namespace tandem::server
