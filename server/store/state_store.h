// Durable coordinator state in SQLite (WAL mode), --state-dir/coordinator.db:
// jobs (the user-facing Job proto in column `job`, the driver's internal
// DriverState with the phase cursor in column `driver`), events, log lines,
// workers and checkpoint records. Schema versioned (meta table) and
// migrated on open: version 3 moved the driver's cursors out of
// Job.recovery into `driver`. Every SQLite error becomes a Status naming
// the operation.
// Thread-safe: one connection, calls serialized by mu_. Nothing here calls
// back into the job manager. The test hook (SetWriteHookForTest) runs
// before a job's write takes mu_, so a test can hold one job's write while
// other jobs' writes go through.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/jobs/phase_plan.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/control.pb.h"
#include "tandem/v1/driver_state.pb.h"
#include "tandem/v1/job.pb.h"

struct sqlite3;

namespace tandem::server {

inline constexpr int kSchemaVersion = 3;

struct StoredJob {
  tandem::v1::Job job;
  tandem::v1::DriverState driver;  // with the phase cursor
  int64_t seq = 0;                 // submission order
};

struct StoredWorker {
  tandem::v1::WorkerInfo info;
  std::string credential_digest;  // CredentialDigest of its credential ("" = none yet)
};

struct StoredEvent {
  int64_t seq = 0;
  tandem::v1::JobEvent event;
};

class StateStore {
 public:
  // Creates the directory and database when missing; refuses a database of
  // a newer schema version.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Next submission sequence number (persisted counter).
  absl::StatusOr<int64_t> NextJobSeq();
  absl::Status PutJob(const tandem::v1::Job& job, const tandem::v1::DriverState& driver, int64_t seq);
  // A job whose driver state is only a cursor (tests, tools).
  absl::Status PutJob(const tandem::v1::Job& job, const PhaseCursor& cursor, int64_t seq);
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();

  // Returns the event's sequence number within its job (1, 2, ...).
  absl::StatusOr<int64_t> AppendEvent(const tandem::v1::JobEvent& event);
  absl::StatusOr<std::vector<StoredEvent>> ListEvents(const std::string& job_id, int64_t after_seq, int limit);
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id);
  // Forgets the job's events with seq <= through (the oldest); seq numbers
  // of the others do not change.
  absl::Status PruneEvents(const std::string& job_id, int64_t through);

  // Assigns seq to each line; returns the last one.
  absl::StatusOr<int64_t> AppendLogs(const std::string& job_id, std::vector<tandem::v1::LogLine> lines);
  absl::StatusOr<std::vector<tandem::v1::LogLine>> ListLogs(const std::string& job_id, int64_t after_seq, int limit);

  absl::Status PutWorker(const tandem::v1::WorkerInfo& worker, const std::string& credential_digest = "");
  absl::StatusOr<std::vector<StoredWorker>> LoadWorkers();

  absl::Status AddCheckpoint(const tandem::v1::CheckpointRecord& record);
  // Forgets the job's checkpoints older than its newest `keep` steps, as the
  // workers' retention (checkpoint.keep) deletes them from disk.
  absl::Status PruneCheckpoints(const std::string& job_id, int64_t keep);
  absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> ListCheckpoints(const std::string& job_id);
  // A record with this job, step, generation and path exists.
  absl::StatusOr<bool> HasCheckpoint(const tandem::v1::CheckpointRecord& record);
  absl::StatusOr<int64_t> CountLogs(const std::string& job_id);

  // Retention: a job with its events, logs and checkpoint records (one
  // transaction); a worker.
  absl::Status DeleteJob(const std::string& job_id);
  absl::Status DeleteWorker(const std::string& worker_id);

  const std::string& path() const { return path_; }

  // Fault injection for tests: every write fails (as on a full or failing
  // disk) until called with false.
  void FailWritesForTest(bool fail) { fail_writes_ = fail; }
  // Fault injection for tests: called with the job id before every write
  // of a job's row, events, logs or checkpoint records, outside mu_ (a test
  // may block in it to stand for a slow disk). Empty: none.
  void SetWriteHookForTest(std::function<void(const std::string& job_id)> hook);

 private:
  StateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteGate() const;
  // WriteGate() plus the test hook for a write of `job_id`'s records.
  absl::Status JobWriteGate(const std::string& job_id) const;
  absl::Status MigrateToDriverColumn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
  std::atomic<bool> fail_writes_{false};
  mutable absl::Mutex hook_mu_;
  std::function<void(const std::string&)> write_hook_ ABSL_GUARDED_BY(hook_mu_);
};

}  // namespace tandem::server
