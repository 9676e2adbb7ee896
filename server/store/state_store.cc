// StateStore: opening and migrating the SQLite file, the writer thread
// that applies queued writes in order, and the checkpointer. The writes are
// in state_store_writes.cc, the reads in state_store_reads.cc.
#include "server/store/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "server/store/sqlite_util.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using sqlite::ExecOn;
using sqlite::OpenConnection;
using sqlite::SqlError;
using sqlite::Stmt;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("state dir ", state_dir, ": ", ec.message()));
  std::string path = (std::filesystem::path(state_dir) / "coordinator.db").string();
  ASSIGN_OR_RETURN(sqlite3 * db, OpenConnection(path, "writer"));
  std::unique_ptr<StateStore> store(new StateStore(db, path));
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON"));
  RETURN_IF_ERROR(store->Migrate());
  RETURN_IF_ERROR(store->OpenSecondaryConnections());
  // The checkpointer copies the WAL back (and fsyncs), never the writer.
  sqlite3_wal_hook(db, &StateStore::OnWalCommit, store.get());
  store->writer_ = std::thread([s = store.get()] { s->WriterLoop(); });
  store->checkpointer_ = std::thread([s = store.get()] { s->CheckpointerLoop(); });
  return store;
}

absl::Status StateStore::OpenSecondaryConnections() {
  ASSIGN_OR_RETURN(sqlite3 * reader, OpenConnection(path_, "reader"));
  {
    absl::MutexLock lock(&read_mu_);
    read_db_ = reader;
  }
  ASSIGN_OR_RETURN(checkpoint_db_, OpenConnection(path_, "checkpointer"));
  return absl::OkStatus();
}

StateStore::~StateStore() {
  {
    absl::MutexLock lock(&queue_mu_);
    stop_writer_ = true;
  }
  if (writer_.joinable()) writer_.join();
  {
    absl::MutexLock lock(&checkpoint_mu_);
    stop_checkpointer_ = true;
  }
  if (checkpointer_.joinable()) checkpointer_.join();
  sqlite3_close(checkpoint_db_);
  {
    absl::MutexLock lock(&read_mu_);
    sqlite3_close(read_db_);
    read_db_ = nullptr;
  }
  // The last connection closed checkpoints the WAL into the database.
  sqlite3_close(db_);
}

absl::Status StateStore::Exec(const char* sql) { return ExecOn(db_, sql); }

absl::Status StateStore::Migrate() {
  RETURN_IF_ERROR(Exec("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)"));
  int64_t version = 0;
  {
    Stmt s(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
    RETURN_IF_ERROR(s.status("read schema version"));
    ASSIGN_OR_RETURN(bool row, s.Step("read schema version"));
    if (row) version = s.Int(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("state store ", path_, " has schema version ", version,
                                                      "; this coordinator knows up to ", kSchemaVersion,
                                                      " (upgrade the coordinator)"));
  }
  if (version < 1) {
    RETURN_IF_ERROR(Exec("BEGIN"));
    absl::Status s = Exec(R"sql(
      CREATE TABLE IF NOT EXISTS jobs (
        id TEXT PRIMARY KEY, seq INTEGER NOT NULL, state INTEGER NOT NULL,
        cursor_unit INTEGER NOT NULL, cursor_sub INTEGER NOT NULL,
        job BLOB NOT NULL, updated_at REAL NOT NULL);
      CREATE TABLE IF NOT EXISTS events (
        job_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, event BLOB NOT NULL,
        PRIMARY KEY (job_id, seq));
      CREATE TABLE IF NOT EXISTS logs (
        job_id TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, source TEXT NOT NULL,
        text TEXT NOT NULL, PRIMARY KEY (job_id, seq));
      CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, name TEXT NOT NULL, info BLOB NOT NULL);
      CREATE TABLE IF NOT EXISTS checkpoints (
        job_id TEXT NOT NULL, step INTEGER NOT NULL, generation INTEGER NOT NULL, path TEXT NOT NULL,
        record BLOB NOT NULL, PRIMARY KEY (job_id, step, generation));
      INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', 1);
      INSERT OR IGNORE INTO meta (key, value) VALUES ('job_seq', 0);
    )sql");
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    RETURN_IF_ERROR(Exec("COMMIT"));
    version = 1;
  }
  if (version < 2) {
    // Version 2: workers carry the digest of their credential.
    RETURN_IF_ERROR(Exec("BEGIN"));
    absl::Status s = Exec(R"sql(
      ALTER TABLE workers ADD COLUMN credential TEXT NOT NULL DEFAULT '';
      INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', 2);
    )sql");
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    RETURN_IF_ERROR(Exec("COMMIT"));
    version = 2;
  }
  if (version < 3) {
    // Version 3: the driver's internal state in its own column.
    RETURN_IF_ERROR(Exec("BEGIN"));
    absl::Status s = MigrateToDriverColumn();
    if (!s.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return s;
    }
    RETURN_IF_ERROR(Exec("COMMIT"));
  }
  return absl::OkStatus();
}

absl::Status StateStore::MigrateToDriverColumn() {
  RETURN_IF_ERROR(Exec("ALTER TABLE jobs ADD COLUMN driver BLOB NOT NULL DEFAULT x''"));
  struct Row {
    std::string id;
    tandem::v1::Job job;
    tandem::v1::DriverState driver;
  };
  std::vector<Row> rows;
  {
    Stmt s(db_, "SELECT id, cursor_unit, cursor_sub, job FROM jobs");
    RETURN_IF_ERROR(s.status("migrate jobs"));
    while (true) {
      ASSIGN_OR_RETURN(bool row, s.Step("migrate jobs"));
      if (!row) break;
      Row r;
      r.id = s.Text(0);
      const std::string blob = s.Text(3);
      tandem::v1::LegacyJobCursors legacy;
      if (!r.job.ParseFromString(blob) || !legacy.ParseFromString(blob)) {
        return absl::DataLossError(absl::StrCat("state store: job ", r.id, " is corrupt"));
      }
      const auto& l = legacy.recovery();
      r.driver.set_cursor_unit(s.Int(1));
      r.driver.set_cursor_sub(s.Int(2));
      r.driver.set_restore_from(l.restore_from());
      r.driver.set_peer_restore_step(l.peer_restore_step());
      *r.driver.mutable_peer_restore_ranks() = l.peer_restore_ranks();
      r.driver.set_peer_failed(l.peer_failed());
      r.driver.set_live_restore(l.live_restore());
      r.driver.set_live_failed(l.live_failed());
      r.driver.set_peer_copy_step(l.peer_copy_step());
      r.driver.set_peer_copy_world(l.peer_copy_world());
      r.driver.set_steps_before(l.steps_before());
      *r.driver.mutable_bad_checkpoints() = l.bad_checkpoints();
      *r.driver.mutable_logical_begin() = l.logical_begin();
      *r.driver.mutable_logical_own() = l.logical_own();
      r.driver.set_has_last_trained(l.has_last_trained());
      r.driver.set_last_trained_step(l.last_trained_step());
      r.driver.set_last_trained_next_unit(l.last_trained_next_unit());
      r.driver.set_last_trained_next_sub(l.last_trained_next_sub());
      r.driver.set_has_inflight_trained(l.has_inflight_trained());
      r.driver.set_inflight_trained_step(l.inflight_trained_step());
      r.driver.set_inflight_next_unit(l.inflight_next_unit());
      r.driver.set_inflight_next_sub(l.inflight_next_sub());
      // The moved fields are reserved in Job.recovery now: drop them.
      r.job.mutable_recovery()->DiscardUnknownFields();
      rows.push_back(std::move(r));
    }
  }
  for (const auto& r : rows) {
    Stmt s(db_, "UPDATE jobs SET job = ?, driver = ? WHERE id = ?");
    RETURN_IF_ERROR(s.status("migrate job"));
    s.BindBlob(1, r.job.SerializeAsString());
    s.BindBlob(2, r.driver.SerializeAsString());
    s.Bind(3, r.id);
    RETURN_IF_ERROR(s.Run(absl::StrCat("migrate job ", r.id)));
  }
  return Exec("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', 3)");
}

absl::Status StateStore::WriteGate() const {
  if (fail_writes_.load())
    return absl::UnavailableError(absl::StrCat("state store ", path_, ": write failed (injected)"));
  return absl::OkStatus();
}

void StateStore::SetWriteHookForTest(std::function<void(const std::string& job_id)> hook) {
  absl::MutexLock lock(&hook_mu_);
  write_hook_ = std::move(hook);
}

void StateStore::SetCheckpointHookForTest(std::function<void()> hook) {
  absl::MutexLock lock(&hook_mu_);
  checkpoint_hook_ = std::move(hook);
}

// ---- The writer ----

absl::StatusOr<WriteTicket> StateStore::Submit(Write write) {
  RETURN_IF_ERROR(WriteGate());
  absl::MutexLock lock(&queue_mu_);
  if (stop_writer_) return absl::UnavailableError(absl::StrCat("state store ", path_, " is closing"));
  write.ticket = next_ticket_++;
  const WriteTicket ticket = write.ticket;
  queue_.push_back(std::move(write));
  return ticket;
}

absl::Status StateStore::Apply(Write write) {
  ASSIGN_OR_RETURN(WriteTicket ticket, Submit(std::move(write)));
  return WaitDurable(ticket);
}

absl::Status StateStore::WaitDurable(WriteTicket ticket, absl::Time deadline) {
  if (ticket <= 0) return absl::OkStatus();
  absl::MutexLock lock(&queue_mu_);
  auto done = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return durable_through_ >= ticket; };
  if (!queue_mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat("state store ", path_, ": write ", ticket, " not committed yet"));
  }
  auto it = failed_.find(ticket);
  if (it == failed_.end()) return absl::OkStatus();
  absl::Status s = it->second;
  failed_.erase(it);
  return s;
}

absl::Status StateStore::WaitForQueuedWrites(absl::Time deadline) {
  WriteTicket last = 0;
  {
    absl::MutexLock lock(&queue_mu_);
    last = next_ticket_ - 1;
  }
  absl::MutexLock lock(&queue_mu_);
  auto done = [this, last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return durable_through_ >= last; };
  if (!queue_mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("state store ", path_, ": writes through ", last, " not committed yet"));
  }
  return absl::OkStatus();
}

WriteTicket StateStore::DurableThrough() const {
  absl::MutexLock lock(&queue_mu_);
  return durable_through_;
}

void StateStore::WriterLoop() {
  // The errors of writes nobody waits for are kept this long (by count).
  constexpr size_t kMaxKeptErrors = 4096;
  while (true) {
    std::vector<Write> batch;
    {
      absl::MutexLock lock(&queue_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) { return stop_writer_ || !queue_.empty(); };
      queue_mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, everything applied
      const size_t n = std::min(queue_.size(), kMaxBatch);
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + n));
      queue_.erase(queue_.begin(), queue_.begin() + n);
    }
    std::vector<absl::Status> statuses(batch.size());
    ApplyBatch(batch, &statuses);
    absl::MutexLock lock(&queue_mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (statuses[i].ok()) continue;
      spdlog::error("state store: write {}{}: {}", batch[i].ticket,
                    batch[i].job_id.empty() ? "" : absl::StrCat(" (job ", batch[i].job_id, ")"),
                    statuses[i].ToString());
      failed_[batch[i].ticket] = statuses[i];
    }
    while (failed_.size() > kMaxKeptErrors) failed_.erase(failed_.begin());
    durable_through_ = batch.back().ticket;
  }
}

void StateStore::ApplyBatch(std::vector<Write>& batch, std::vector<absl::Status>* statuses) {
  // The last write of each coalescing key; the earlier ones share its fate.
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].coalesce_key.empty()) last[batch[i].coalesce_key] = i;
  }
  auto fail_all = [&](const absl::Status& s) {
    for (auto& st : *statuses) {
      if (st.ok()) st = s;
    }
  };
  if (absl::Status s = Exec("BEGIN"); !s.ok()) {
    fail_all(s);
    return;
  }
  std::set<std::string> jobs;
  for (size_t i = 0; i < batch.size(); ++i) {
    Write& w = batch[i];
    if (!w.coalesce_key.empty() && last[w.coalesce_key] != i) continue;
    if (!w.job_id.empty()) jobs.insert(w.job_id);
    absl::Status s = Exec("SAVEPOINT w");
    if (s.ok()) {
      s = w.apply(db_);
      if (!s.ok()) Exec("ROLLBACK TO w").IgnoreError();
      Exec("RELEASE w").IgnoreError();
    }
    (*statuses)[i] = s;
  }
  std::function<void(const std::string&)> hook;
  {
    absl::MutexLock lock(&hook_mu_);
    hook = write_hook_;
  }
  if (hook) {
    for (const auto& job : jobs) hook(job);
  }
  if (absl::Status s = Exec("COMMIT"); !s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    for (auto& st : *statuses) st = s;
    return;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::string& key = batch[i].coalesce_key;
    if (!key.empty() && last[key] != i) (*statuses)[i] = (*statuses)[last[key]];
  }
}

// ---- The checkpointer ----

int StateStore::OnWalCommit(void* self, sqlite3* /*db*/, const char* /*name*/, int pages) {
  if (pages >= kCheckpointPages) static_cast<StateStore*>(self)->RequestCheckpoint();
  return SQLITE_OK;
}

void StateStore::RequestCheckpoint() {
  absl::MutexLock lock(&checkpoint_mu_);
  checkpoint_wanted_ = true;
}

void StateStore::CheckpointerLoop() {
  while (true) {
    {
      absl::MutexLock lock(&checkpoint_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) {
        return stop_checkpointer_ || checkpoint_wanted_;
      };
      checkpoint_mu_.Await(absl::Condition(&ready));
      if (stop_checkpointer_) return;
      checkpoint_wanted_ = false;
    }
    std::function<void()> hook;
    {
      absl::MutexLock lock(&hook_mu_);
      hook = checkpoint_hook_;
    }
    if (hook) hook();
    int wal_pages = 0, copied = 0;
    int rc = sqlite3_wal_checkpoint_v2(checkpoint_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, &wal_pages, &copied);
    if (rc != SQLITE_OK && rc != SQLITE_BUSY) {
      spdlog::error("{}", SqlError(checkpoint_db_, "checkpoint", rc).ToString());
    }
    checkpoints_++;
  }
}

}  // namespace tandem::server
