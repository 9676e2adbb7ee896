// Durable coordinator state in SQLite (WAL mode), --state-dir/coordinator.db:
// jobs (the user-facing Job proto in column `job`, the driver's internal
// DriverState with the phase cursor in column `driver`), events, log lines,
// workers and checkpoint records. Schema versioned (meta table) and
// migrated on open: version 3 moved the driver's cursors out of
// Job.recovery into `driver`. Every SQLite error becomes a Status naming
// the operation.
//
// Threads and connections. One writer thread owns the write connection: a
// write is queued (Submit*, which never waits) and gets a ticket; the writer
// takes everything queued as one batch, applies it in ticket order in one
// transaction (each write in its own savepoint, so one bad write fails
// alone), and commits. Within a batch only the last PutJob of a job is
// written: the batch commits atomically, so the earlier states are never
// visible anyway. Reads use their own connection (WAL: a reader sees the last
// commit and never waits for the writer). With synchronous=NORMAL a commit
// appends to the WAL without an fsync; the fsyncs happen when the WAL is
// copied back into the database (a checkpoint), which a checkpointer thread
// with a third connection runs (PASSIVE: it never blocks the writer or a
// reader). So a commit waits for no fsync (but one: the WAL header's, when
// the WAL starts over after a checkpoint), and a caller waits for the
// writer only when it asks to (WaitDurable, or the synchronous forms below,
// which are Submit + WaitDurable).
//
// Durability invariant. A write is durable once WaitDurable(its ticket)
// returns OK: its transaction is in the WAL, which survives a crash of the
// coordinator process (a power loss may roll back the newest commits, never
// tear one). Writes are applied in ticket order, so a restarted coordinator
// reads every write up to some ticket and none after it. Callers make a side
// effect that depends on a write (the phase command at the cursor it
// records, the answer to a submission or a cancellation, the acknowledgement
// of a published checkpoint, a worker's credential) only after WaitDurable
// of that write: the state recovered after a crash is one that was durable
// before every side effect that depended on it. Callers wait on their own
// thread, never under a lock another job or the registry needs.
//
// Thread-safe. Nothing here calls back into the job manager. Test hooks run
// on the store's own threads: the write hook inside a batch's transaction
// just before its commit, the checkpoint hook just before a checkpoint (where
// the fsyncs are); a test may block in either to stand for a slow disk.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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

// A write's place in the store's one ordered log (1, 2, ...); 0: none.
using WriteTicket = int64_t;

class StateStore {
 public:
  // Creates the directory and database when missing; refuses a database of
  // a newer schema version. Starts the writer and checkpointer threads.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  // Applies every queued write, then joins the threads and closes.
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Queued writes: they return at once with the write's ticket, or with the
  // error when the store refuses writes. Errors found when the write is
  // applied are logged and returned by WaitDurable.
  absl::StatusOr<WriteTicket> SubmitPutJob(const tandem::v1::Job& job, const tandem::v1::DriverState& driver,
                                           int64_t seq);
  // The event with its sequence number within its job, chosen by the caller
  // (the job's driver counts them).
  absl::StatusOr<WriteTicket> SubmitEvent(const tandem::v1::JobEvent& event, int64_t seq);
  absl::StatusOr<WriteTicket> SubmitPruneEvents(const std::string& job_id, int64_t through);
  // Numbers the lines after the job's last stored one.
  absl::StatusOr<WriteTicket> SubmitLogs(const std::string& job_id, std::vector<tandem::v1::LogLine> lines);
  absl::StatusOr<WriteTicket> SubmitCheckpoint(const tandem::v1::CheckpointRecord& record);
  absl::StatusOr<WriteTicket> SubmitPruneCheckpoints(const std::string& job_id, int64_t keep);
  absl::StatusOr<WriteTicket> SubmitPutWorker(const tandem::v1::WorkerInfo& worker,
                                              const std::string& credential_digest);
  absl::StatusOr<WriteTicket> SubmitDeleteWorker(const std::string& worker_id);
  // Waits until the write with `ticket` (and so every earlier one) is
  // committed: OK, or its own error. DEADLINE_EXCEEDED when `deadline`
  // passes first. Ticket 0 returns at once.
  absl::Status WaitDurable(WriteTicket ticket, absl::Time deadline = absl::InfiniteFuture());
  // The highest ticket committed so far.
  WriteTicket DurableThrough() const;
  // Waits until every write queued before the call is committed (a reader
  // that must see them: tools, tests). OK, or DEADLINE_EXCEEDED.
  absl::Status WaitForQueuedWrites(absl::Time deadline = absl::InfiniteFuture());

  // Synchronous forms: Submit* + WaitDurable.
  // Next submission sequence number (persisted counter).
  absl::StatusOr<int64_t> NextJobSeq();
  absl::Status PutJob(const tandem::v1::Job& job, const tandem::v1::DriverState& driver, int64_t seq);
  // A job whose driver state is only a cursor (tests, tools).
  absl::Status PutJob(const tandem::v1::Job& job, const PhaseCursor& cursor, int64_t seq);
  // Returns the event's sequence number within its job (1, 2, ...).
  absl::StatusOr<int64_t> AppendEvent(const tandem::v1::JobEvent& event);
  // Forgets the job's events with seq <= through (the oldest); seq numbers
  // of the others do not change.
  absl::Status PruneEvents(const std::string& job_id, int64_t through);
  // Assigns seq to each line; returns the last one.
  absl::StatusOr<int64_t> AppendLogs(const std::string& job_id, std::vector<tandem::v1::LogLine> lines);
  absl::Status PutWorker(const tandem::v1::WorkerInfo& worker, const std::string& credential_digest = "");
  absl::Status AddCheckpoint(const tandem::v1::CheckpointRecord& record);
  // Forgets the job's checkpoints older than its newest `keep` steps, as the
  // workers' retention (checkpoint.keep) deletes them from disk.
  absl::Status PruneCheckpoints(const std::string& job_id, int64_t keep);
  // Retention: a job with its events, logs and checkpoint records (one
  // transaction); a worker.
  absl::Status DeleteJob(const std::string& job_id);
  absl::Status DeleteWorker(const std::string& worker_id);

  // Reads (the read connection: the last commit, never waiting for a write).
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();
  absl::StatusOr<std::vector<StoredEvent>> ListEvents(const std::string& job_id, int64_t after_seq, int limit);
  absl::StatusOr<int64_t> LastEventSeq(const std::string& job_id);
  absl::StatusOr<std::vector<tandem::v1::LogLine>> ListLogs(const std::string& job_id, int64_t after_seq, int limit);
  absl::StatusOr<std::vector<StoredWorker>> LoadWorkers();
  absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> ListCheckpoints(const std::string& job_id);
  // A record with this job, step, generation and path exists.
  absl::StatusOr<bool> HasCheckpoint(const tandem::v1::CheckpointRecord& record);
  absl::StatusOr<int64_t> CountLogs(const std::string& job_id);

  const std::string& path() const { return path_; }

  // Fault injection for tests: every write fails (as on a full or failing
  // disk) until called with false.
  void FailWritesForTest(bool fail) { fail_writes_ = fail; }
  // Fault injection for tests: called on the writer thread, inside a batch's
  // transaction after its statements and before its COMMIT, once with each
  // job whose records the batch writes. A test may block in it to stand for
  // a slow write: the writer (and so every later write) waits. Empty: none.
  void SetWriteHookForTest(std::function<void(const std::string& job_id)> hook);
  // Fault injection for tests: called on the checkpointer thread before each
  // checkpoint (where the fsyncs are). A test may block in it to stand for a
  // slow fsync. Empty: none.
  void SetCheckpointHookForTest(std::function<void()> hook);
  // Asks the checkpointer for a checkpoint now (it also runs one whenever the
  // WAL has grown by kCheckpointPages since the last).
  void RequestCheckpoint();
  int64_t CheckpointsForTest() const { return checkpoints_.load(); }

  static constexpr int kCheckpointPages = 1000;
  // The most writes one transaction takes.
  static constexpr size_t kMaxBatch = 512;

  // One queued write: `apply` runs on the writer thread with the write
  // connection, inside the batch's transaction.
  struct Write {
    std::string job_id;        // whose records ("" none): the write hook's argument
    std::string coalesce_key;  // non-empty: a later write with this key in the batch replaces it
    std::function<absl::Status(sqlite3*)> apply;
    WriteTicket ticket = 0;
  };

 private:
  StateStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // On the opening thread, before the threads start.
  absl::Status Exec(const char* sql);
  absl::Status Migrate();
  absl::Status MigrateToDriverColumn();
  absl::Status OpenSecondaryConnections();
  absl::Status WriteGate() const;
  absl::StatusOr<WriteTicket> Submit(Write write);
  // Submit + WaitDurable.
  absl::Status Apply(Write write);
  void WriterLoop();
  void ApplyBatch(std::vector<Write>& batch, std::vector<absl::Status>* statuses);
  void CheckpointerLoop();
  static int OnWalCommit(void* self, sqlite3* db, const char* name, int pages);

  // Written only by the opening thread, then by the writer thread.
  sqlite3* db_;
  const std::string path_;
  std::atomic<bool> fail_writes_{false};

  mutable absl::Mutex queue_mu_;
  std::vector<Write> queue_ ABSL_GUARDED_BY(queue_mu_);
  WriteTicket next_ticket_ ABSL_GUARDED_BY(queue_mu_) = 1;
  WriteTicket durable_through_ ABSL_GUARDED_BY(queue_mu_) = 0;
  std::map<WriteTicket, absl::Status> failed_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_writer_ ABSL_GUARDED_BY(queue_mu_) = false;
  std::thread writer_;

  mutable absl::Mutex read_mu_;
  sqlite3* read_db_ ABSL_GUARDED_BY(read_mu_) = nullptr;

  mutable absl::Mutex checkpoint_mu_;
  sqlite3* checkpoint_db_ = nullptr;  // the checkpointer thread's
  bool checkpoint_wanted_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  bool stop_checkpointer_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  std::atomic<int64_t> checkpoints_{0};
  std::thread checkpointer_;

  mutable absl::Mutex hook_mu_;
  std::function<void(const std::string&)> write_hook_ ABSL_GUARDED_BY(hook_mu_);
  std::function<void()> checkpoint_hook_ ABSL_GUARDED_BY(hook_mu_);
};

}  // namespace tandem::server
