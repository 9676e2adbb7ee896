// StateStore writes: each Submit* queues one write for the writer thread
// (state_store.cc) and returns its ticket; the blocking forms wait for it.
#include "server/store/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "server/store/sqlite_util.h"

namespace tandem::server {

using sqlite::ExecOn;
using sqlite::OpenConnection;
using sqlite::SqlError;
using sqlite::Stmt;

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

}  // namespace tandem::server
