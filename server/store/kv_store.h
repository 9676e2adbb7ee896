// Rendezvous key-value store for the data plane (Gloo's Store, NCCL unique
// ids), scoped by (job, generation). Bounded: key <= 512 bytes, value <= 1
// MiB, entries and bytes per scope and number of scopes capped. Waits have
// a timeout and end early when the store shuts down or the caller's
// `cancelled` callback says so. Add() keeps the counter as a decimal string
// (as c10d's TCPStore does), so Get on it returns e.g. "3".
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::server {

struct KvLimits {
  size_t max_key_bytes = 512;
  size_t max_value_bytes = 1 << 20;
  size_t max_entries_per_scope = 16384;
  size_t max_bytes_per_scope = 256 << 20;
  size_t max_scopes = 4096;
  int64_t max_timeout_ms = 30 * 60 * 1000;
};

class KvStore {
 public:
  using CancelledFn = std::function<bool()>;
  explicit KvStore(KvLimits limits = {}) : limits_(limits) {}

  absl::Status Set(const std::string& scope, const std::string& key, std::string value);
  // Waits up to timeout_ms (0 = no wait) for the key; DEADLINE_EXCEEDED names it.
  absl::StatusOr<std::string> Get(const std::string& scope, const std::string& key, int64_t timeout_ms,
                                  const CancelledFn& cancelled = nullptr);
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key, int64_t delta);
  absl::Status Wait(const std::string& scope, const std::vector<std::string>& keys, int64_t timeout_ms,
                    const CancelledFn& cancelled = nullptr);
  absl::StatusOr<bool> Delete(const std::string& scope, const std::string& key);

  // Drops every scope of a job ("<job>/..."): called when the job ends or
  // its generation changes.
  void DropJob(const std::string& job_id);
  void DropScope(const std::string& scope);
  // Ends every wait (shutdown).
  void Shutdown();
  size_t scope_count() const;

  static std::string ScopeName(const std::string& job_id, int64_t generation);

 private:
  struct Scope {
    std::map<std::string, std::string> entries;
    size_t bytes = 0;
  };
  absl::Status CheckKey(const std::string& key) const;
  absl::StatusOr<Scope*> GetScope(const std::string& scope, bool create) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WaitFor(const std::string& scope, const std::vector<std::string>& keys, int64_t timeout_ms,
                       const CancelledFn& cancelled) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Put(Scope* s, const std::string& key, std::string value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvLimits limits_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::map<std::string, Scope> scopes_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::server
