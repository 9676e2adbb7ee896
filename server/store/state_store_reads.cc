// StateStore reads, on the read connection (never behind the writer).
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
