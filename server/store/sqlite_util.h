// SQLite helpers shared by the state store's files: errors as Status, an
// RAII prepared statement, opening a connection and running plain SQL.
// Internal to server/store.
#pragma once

#include <sqlite3.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem::server::sqlite {

inline absl::Status SqlError(sqlite3* db, absl::string_view what, int rc) {
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

inline absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, const char* role) {
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

inline absl::Status ExecOn(sqlite3* db, const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("state store: ", sql, ": ", msg));
  }
  return absl::OkStatus();
}

}  // namespace tandem::server::sqlite
