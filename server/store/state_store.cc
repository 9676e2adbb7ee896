#include "server/store/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

absl::Status SqlError(sqlite3* db, absl::string_view what, int rc) {
  return absl::InternalError(absl::StrCat("state store: ", what, ": ", sqlite3_errstr(rc),
                                          db ? absl::StrCat(" (", sqlite3_errmsg(db), ")") : ""));
}

// RAII prepared statement.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  absl::Status status(absl::string_view what) const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqlError(db_, what, rc_);
  }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  // SQLITE_ROW -> true; SQLITE_DONE -> false; else error.
  absl::StatusOr<bool> Step(absl::string_view what) {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, what, rc);
  }
  absl::Status Run(absl::string_view what) {
    auto r = Step(what);
    return r.ok() ? absl::OkStatus() : r.status();
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), n) : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, const char* role) {
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqlError(db, absl::StrCat("open ", path, " (", role, ")"), rc);
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 5000);
  return db;
}

absl::Status ExecOn(sqlite3* db, const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state store: ", sql, ": ", msg));
  }
  return absl::OkStatus();
}

}  // namespace

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

// ---- Writes ----

absl::StatusOr<int64_t> StateStore::NextJobSeq() {
  auto seq = std::make_shared<int64_t>(0);
  Write w;
  w.apply = [seq](sqlite3* db) -> absl::Status {
    Stmt s(db, "UPDATE meta SET value = value + 1 WHERE key = 'job_seq' RETURNING value");
    RETURN_IF_ERROR(s.status("next job seq"));
    ASSIGN_OR_RETURN(bool row, s.Step("next job seq"));
    if (!row) return absl::InternalError("state store: job_seq counter missing");
    *seq = s.Int(0);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(Apply(std::move(w)));
  return *seq;
}

absl::StatusOr<WriteTicket> StateStore::SubmitPutJob(const tandem::v1::Job& job, const tandem::v1::DriverState& driver,
                                                     int64_t seq) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = job.id();
  w.coalesce_key = absl::StrCat("job/", job.id());
  w.apply = [id = job.id(), state = static_cast<int64_t>(job.state()), unit = driver.cursor_unit(),
             sub = driver.cursor_sub(), job_blob = job.SerializeAsString(), driver_blob = driver.SerializeAsString(),
             seq](sqlite3* db) -> absl::Status {
    // cursor_unit and cursor_sub repeat the driver state's cursor for people
    // reading the database with sqlite3.
    Stmt s(db,
           "INSERT OR REPLACE INTO jobs (id, seq, state, cursor_unit, cursor_sub, job, updated_at, driver) "
           "VALUES (?, ?, ?, ?, ?, ?, julianday('now'), ?)");
    RETURN_IF_ERROR(s.status("put job"));
    s.Bind(1, id);
    s.Bind(2, seq);
    s.Bind(3, state);
    s.Bind(4, unit);
    s.Bind(5, sub);
    s.BindBlob(6, job_blob);
    s.BindBlob(7, driver_blob);
    return s.Run(absl::StrCat("put job ", id));
  };
  return Submit(std::move(w));
}

absl::Status StateStore::PutJob(const tandem::v1::Job& job, const PhaseCursor& cursor, int64_t seq) {
  tandem::v1::DriverState driver;
  driver.set_cursor_unit(cursor.unit);
  driver.set_cursor_sub(cursor.sub);
  return PutJob(job, driver, seq);
}

absl::Status StateStore::PutJob(const tandem::v1::Job& job, const tandem::v1::DriverState& driver, int64_t seq) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitPutJob(job, driver, seq));
  return WaitDurable(t);
}

absl::StatusOr<WriteTicket> StateStore::SubmitEvent(const tandem::v1::JobEvent& event, int64_t seq) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = event.job_id();
  w.apply = [job = event.job_id(), time = event.time(), blob = event.SerializeAsString(),
             seq](sqlite3* db) -> absl::Status {
    Stmt s(db, "INSERT OR REPLACE INTO events (job_id, seq, time, event) VALUES (?, ?, ?, ?)");
    RETURN_IF_ERROR(s.status("append event"));
    s.Bind(1, job);
    s.Bind(2, seq);
    s.Bind(3, time);
    s.BindBlob(4, blob);
    return s.Run("append event");
  };
  return Submit(std::move(w));
}

absl::StatusOr<int64_t> StateStore::AppendEvent(const tandem::v1::JobEvent& event) {
  auto seq = std::make_shared<int64_t>(0);
  Write w;
  w.job_id = event.job_id();
  w.apply = [seq, job = event.job_id(), time = event.time(),
             blob = event.SerializeAsString()](sqlite3* db) -> absl::Status {
    Stmt s(db,
           "INSERT INTO events (job_id, seq, time, event) VALUES (?1, "
           "(SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id = ?1), ?2, ?3) RETURNING seq");
    RETURN_IF_ERROR(s.status("append event"));
    s.Bind(1, job);
    s.Bind(2, time);
    s.BindBlob(3, blob);
    ASSIGN_OR_RETURN(bool row, s.Step("append event"));
    if (!row) return absl::InternalError("state store: append event returned no seq");
    *seq = s.Int(0);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(WriteGate());
  RETURN_IF_ERROR(Apply(std::move(w)));
  return *seq;
}

absl::StatusOr<WriteTicket> StateStore::SubmitPruneEvents(const std::string& job_id, int64_t through) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = job_id;
  w.apply = [job_id, through](sqlite3* db) -> absl::Status {
    Stmt s(db, "DELETE FROM events WHERE job_id = ? AND seq <= ?");
    RETURN_IF_ERROR(s.status("prune events"));
    s.Bind(1, job_id);
    s.Bind(2, through);
    return s.Run("prune events");
  };
  return Submit(std::move(w));
}

absl::Status StateStore::PruneEvents(const std::string& job_id, int64_t through) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitPruneEvents(job_id, through));
  return WaitDurable(t);
}

namespace {

// Appends `lines` after the job's last stored line; returns the last seq.
absl::StatusOr<int64_t> InsertLogs(sqlite3* db, const std::string& job_id,
                                   const std::vector<tandem::v1::LogLine>& lines) {
  int64_t seq = 0;
  {
    Stmt s(db, "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE job_id = ?");
    RETURN_IF_ERROR(s.status("append logs"));
    s.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, s.Step("append logs"));
    if (row) seq = s.Int(0);
  }
  for (const auto& line : lines) {
    Stmt s(db, "INSERT INTO logs (job_id, seq, time, source, text) VALUES (?, ?, ?, ?, ?)");
    RETURN_IF_ERROR(s.status("append logs"));
    s.Bind(1, job_id);
    s.Bind(2, ++seq);
    s.Bind(3, line.time());
    s.Bind(4, line.source());
    s.Bind(5, line.text());
    RETURN_IF_ERROR(s.Run("append logs"));
  }
  return seq;
}

}  // namespace

absl::StatusOr<WriteTicket> StateStore::SubmitLogs(const std::string& job_id, std::vector<tandem::v1::LogLine> lines) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = job_id;
  w.apply = [job_id, lines = std::move(lines)](sqlite3* db) -> absl::Status {
    return InsertLogs(db, job_id, lines).status();
  };
  return Submit(std::move(w));
}

absl::StatusOr<int64_t> StateStore::AppendLogs(const std::string& job_id, std::vector<tandem::v1::LogLine> lines) {
  RETURN_IF_ERROR(WriteGate());
  auto seq = std::make_shared<int64_t>(0);
  Write w;
  w.job_id = job_id;
  w.apply = [seq, job_id, lines = std::move(lines)](sqlite3* db) -> absl::Status {
    ASSIGN_OR_RETURN(*seq, InsertLogs(db, job_id, lines));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(Apply(std::move(w)));
  return *seq;
}

absl::StatusOr<WriteTicket> StateStore::SubmitPutWorker(const tandem::v1::WorkerInfo& worker,
                                                        const std::string& credential_digest) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.apply = [id = worker.id(), name = worker.name(), blob = worker.SerializeAsString(),
             credential_digest](sqlite3* db) -> absl::Status {
    Stmt s(db, "INSERT OR REPLACE INTO workers (id, name, info, credential) VALUES (?, ?, ?, ?)");
    RETURN_IF_ERROR(s.status("put worker"));
    s.Bind(1, id);
    s.Bind(2, name);
    s.BindBlob(3, blob);
    s.Bind(4, credential_digest);
    return s.Run(absl::StrCat("put worker ", id));
  };
  return Submit(std::move(w));
}

absl::Status StateStore::PutWorker(const tandem::v1::WorkerInfo& worker, const std::string& credential_digest) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitPutWorker(worker, credential_digest));
  return WaitDurable(t);
}

absl::StatusOr<WriteTicket> StateStore::SubmitCheckpoint(const tandem::v1::CheckpointRecord& record) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = record.job_id();
  w.apply = [job = record.job_id(), step = record.step(), generation = record.generation(), path = record.path(),
             blob = record.SerializeAsString()](sqlite3* db) -> absl::Status {
    Stmt s(db, "INSERT OR REPLACE INTO checkpoints (job_id, step, generation, path, record) VALUES (?, ?, ?, ?, ?)");
    RETURN_IF_ERROR(s.status("add checkpoint"));
    s.Bind(1, job);
    s.Bind(2, step);
    s.Bind(3, generation);
    s.Bind(4, path);
    s.BindBlob(5, blob);
    return s.Run("add checkpoint");
  };
  return Submit(std::move(w));
}

absl::Status StateStore::AddCheckpoint(const tandem::v1::CheckpointRecord& record) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitCheckpoint(record));
  return WaitDurable(t);
}

absl::StatusOr<WriteTicket> StateStore::SubmitPruneCheckpoints(const std::string& job_id, int64_t keep) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = job_id;
  w.apply = [job_id, keep](sqlite3* db) -> absl::Status {
    Stmt s(db,
           "DELETE FROM checkpoints WHERE job_id = ? AND step NOT IN "
           "(SELECT DISTINCT step FROM checkpoints WHERE job_id = ? ORDER BY step DESC LIMIT ?)");
    RETURN_IF_ERROR(s.status("prune checkpoints"));
    s.Bind(1, job_id);
    s.Bind(2, job_id);
    s.Bind(3, keep);
    return s.Run("prune checkpoints");
  };
  return Submit(std::move(w));
}

absl::Status StateStore::PruneCheckpoints(const std::string& job_id, int64_t keep) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitPruneCheckpoints(job_id, keep));
  return WaitDurable(t);
}

absl::Status StateStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.job_id = job_id;
  // Its own savepoint: all four tables or none.
  w.apply = [job_id](sqlite3* db) -> absl::Status {
    for (const char* table : {"jobs", "events", "logs", "checkpoints"}) {
      Stmt s(db,
             absl::StrCat("DELETE FROM ", table, table == std::string("jobs") ? " WHERE id = ?" : " WHERE job_id = ?")
                 .c_str());
      RETURN_IF_ERROR(s.status("delete job"));
      s.Bind(1, job_id);
      RETURN_IF_ERROR(s.Run(absl::StrCat("delete job ", job_id)));
    }
    return absl::OkStatus();
  };
  return Apply(std::move(w));
}

absl::StatusOr<WriteTicket> StateStore::SubmitDeleteWorker(const std::string& worker_id) {
  RETURN_IF_ERROR(WriteGate());
  Write w;
  w.apply = [worker_id](sqlite3* db) -> absl::Status {
    Stmt s(db, "DELETE FROM workers WHERE id = ?");
    RETURN_IF_ERROR(s.status("delete worker"));
    s.Bind(1, worker_id);
    return s.Run(absl::StrCat("delete worker ", worker_id));
  };
  return Submit(std::move(w));
}

absl::Status StateStore::DeleteWorker(const std::string& worker_id) {
  ASSIGN_OR_RETURN(WriteTicket t, SubmitDeleteWorker(worker_id));
  return WaitDurable(t);
}

// ---- Reads ----

absl::StatusOr<std::vector<StoredJob>> StateStore::LoadJobs() {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT seq, job, driver FROM jobs ORDER BY seq");
  RETURN_IF_ERROR(s.status("load jobs"));
  std::vector<StoredJob> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step("load jobs"));
    if (!row) break;
    StoredJob j;
    j.seq = s.Int(0);
    if (!j.job.ParseFromString(s.Text(1)) || !j.driver.ParseFromString(s.Text(2))) {
      return absl::DataLossError(absl::StrCat("state store: job with seq ", j.seq, " is corrupt"));
    }
    out.push_back(std::move(j));
  }
  return out;
}

absl::StatusOr<std::vector<StoredEvent>> StateStore::ListEvents(const std::string& job_id, int64_t after_seq,
                                                                int limit) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT seq, event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?");
  RETURN_IF_ERROR(s.status("list events"));
  s.Bind(1, job_id);
  s.Bind(2, after_seq);
  s.Bind(3, static_cast<int64_t>(limit));
  std::vector<StoredEvent> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step("list events"));
    if (!row) break;
    StoredEvent e;
    e.seq = s.Int(0);
    if (!e.event.ParseFromString(s.Text(1))) return absl::DataLossError("state store: corrupt event");
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<int64_t> StateStore::LastEventSeq(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?");
  RETURN_IF_ERROR(s.status("last event"));
  s.Bind(1, job_id);
  ASSIGN_OR_RETURN(bool row, s.Step("last event"));
  return row ? s.Int(0) : 0;
}

absl::StatusOr<std::vector<tandem::v1::LogLine>> StateStore::ListLogs(const std::string& job_id, int64_t after_seq,
                                                                      int limit) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT seq, time, source, text FROM logs WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?");
  RETURN_IF_ERROR(s.status("list logs"));
  s.Bind(1, job_id);
  s.Bind(2, after_seq);
  s.Bind(3, static_cast<int64_t>(limit));
  std::vector<tandem::v1::LogLine> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step("list logs"));
    if (!row) break;
    tandem::v1::LogLine line;
    line.set_seq(s.Int(0));
    line.set_time(s.Double(1));
    line.set_source(s.Text(2));
    line.set_text(s.Text(3));
    out.push_back(std::move(line));
  }
  return out;
}

absl::StatusOr<std::vector<StoredWorker>> StateStore::LoadWorkers() {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT info, credential FROM workers ORDER BY id");
  RETURN_IF_ERROR(s.status("load workers"));
  std::vector<StoredWorker> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step("load workers"));
    if (!row) break;
    StoredWorker w;
    if (!w.info.ParseFromString(s.Text(0))) return absl::DataLossError("state store: corrupt worker record");
    w.credential_digest = s.Text(1);
    out.push_back(std::move(w));
  }
  return out;
}

absl::StatusOr<bool> StateStore::HasCheckpoint(const tandem::v1::CheckpointRecord& record) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT 1 FROM checkpoints WHERE job_id = ? AND step = ? AND generation = ? AND path = ?");
  RETURN_IF_ERROR(s.status("find checkpoint"));
  s.Bind(1, record.job_id());
  s.Bind(2, record.step());
  s.Bind(3, record.generation());
  s.Bind(4, record.path());
  return s.Step("find checkpoint");
}

absl::StatusOr<int64_t> StateStore::CountLogs(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT COUNT(*) FROM logs WHERE job_id = ?");
  RETURN_IF_ERROR(s.status("count logs"));
  s.Bind(1, job_id);
  ASSIGN_OR_RETURN(bool row, s.Step("count logs"));
  return row ? s.Int(0) : 0;
}

absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> StateStore::ListCheckpoints(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt s(read_db_, "SELECT record FROM checkpoints WHERE job_id = ? ORDER BY step, generation");
  RETURN_IF_ERROR(s.status("list checkpoints"));
  s.Bind(1, job_id);
  std::vector<tandem::v1::CheckpointRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step("list checkpoints"));
    if (!row) break;
    tandem::v1::CheckpointRecord r;
    if (!r.ParseFromString(s.Text(0))) return absl::DataLossError("state store: corrupt checkpoint record");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace tandem::server
