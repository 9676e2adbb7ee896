#include "server/store/kv_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_util.h"

namespace tandem::server {

std::string KvStore::ScopeName(const std::string& job_id, int64_t generation) {
  return absl::StrCat(job_id, "/", generation);
}

absl::Status KvStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key: required");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key: too long (", key.size(), " bytes; at most ", limits_.max_key_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvStore::Scope*> KvStore::GetScope(const std::string& scope, bool create) {
  auto it = scopes_.find(scope);
  if (it != scopes_.end()) return &it->second;
  if (!create) return nullptr;
  if (scopes_.size() >= limits_.max_scopes) {
    return absl::ResourceExhaustedError(absl::StrCat("store: too many scopes (", scopes_.size(), ")"));
  }
  return &scopes_[scope];
}

absl::Status KvStore::Put(Scope* s, const std::string& key, std::string value) {
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("value: too large (", value.size(), " bytes; at most ", limits_.max_value_bytes, ")"));
  }
  auto it = s->entries.find(key);
  size_t old = it == s->entries.end() ? 0 : key.size() + it->second.size();
  if (it == s->entries.end() && s->entries.size() >= limits_.max_entries_per_scope) {
    return absl::ResourceExhaustedError(absl::StrCat("store: scope is full (", s->entries.size(), " entries)"));
  }
  size_t bytes = s->bytes - old + key.size() + value.size();
  if (bytes > limits_.max_bytes_per_scope) {
    return absl::ResourceExhaustedError(absl::StrCat("store: scope is full (", s->bytes, " bytes)"));
  }
  s->bytes = bytes;
  s->entries[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::Status KvStore::Set(const std::string& scope, const std::string& key, std::string value) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Scope * s, GetScope(scope, true));
  return Put(s, key, std::move(value));
}

absl::Status KvStore::WaitFor(const std::string& scope, const std::vector<std::string>& keys, int64_t timeout_ms,
                              const CancelledFn& cancelled) {
  if (timeout_ms < 0 || timeout_ms > limits_.max_timeout_ms) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: must be in [0, ", limits_.max_timeout_ms, "], got ", timeout_ms));
  }
  absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  while (true) {
    auto it = scopes_.find(scope);
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (it == scopes_.end() || !it->second.entries.count(k)) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (shutdown_) return absl::UnavailableError("store: coordinator shutting down");
    if (cancelled && cancelled()) return absl::CancelledError("store: wait cancelled");
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store: timed out after ", timeout_ms, " ms waiting for key(s) ", absl::StrJoin(missing, ", ")));
    }
    // Wake at least every 200 ms to look at `cancelled`.
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(200)));
  }
}

absl::StatusOr<std::string> KvStore::Get(const std::string& scope, const std::string& key, int64_t timeout_ms,
                                         const CancelledFn& cancelled) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(WaitFor(scope, {key}, timeout_ms, cancelled));
  return scopes_[scope].entries[key];
}

absl::StatusOr<int64_t> KvStore::Add(const std::string& scope, const std::string& key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Scope * s, GetScope(scope, true));
  int64_t value = 0;
  auto it = s->entries.find(key);
  if (it != s->entries.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(absl::StrCat("store: key ", key, " does not hold a counter"));
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return absl::OutOfRangeError(absl::StrCat("store: counter ", key, " would overflow int64 (adding ", delta, ")"));
  }
  RETURN_IF_ERROR(Put(s, key, absl::StrCat(value)));
  return value;
}

absl::Status KvStore::Wait(const std::string& scope, const std::vector<std::string>& keys, int64_t timeout_ms,
                           const CancelledFn& cancelled) {
  for (const auto& k : keys) RETURN_IF_ERROR(CheckKey(k));
  absl::MutexLock lock(&mu_);
  return WaitFor(scope, keys, timeout_ms, cancelled);
}

absl::StatusOr<bool> KvStore::Delete(const std::string& scope, const std::string& key) {
  RETURN_IF_ERROR(CheckKey(key));
  absl::MutexLock lock(&mu_);
  auto it = scopes_.find(scope);
  if (it == scopes_.end()) return false;
  auto e = it->second.entries.find(key);
  if (e == it->second.entries.end()) return false;
  it->second.bytes -= e->first.size() + e->second.size();
  it->second.entries.erase(e);
  changed_.SignalAll();
  return true;
}

void KvStore::DropJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  std::string prefix = job_id + "/";
  for (auto it = scopes_.lower_bound(prefix); it != scopes_.end() && it->first.rfind(prefix, 0) == 0;) {
    it = scopes_.erase(it);
  }
  changed_.SignalAll();
}

void KvStore::DropScope(const std::string& scope) {
  absl::MutexLock lock(&mu_);
  scopes_.erase(scope);
  changed_.SignalAll();
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

size_t KvStore::scope_count() const {
  absl::MutexLock lock(&mu_);
  return scopes_.size();
}

}  // namespace tandem::server
