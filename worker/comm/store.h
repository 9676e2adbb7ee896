// Store: the small key-value rendezvous store collectives meet through
// (c10d's Store). Keys are strings, values bytes. Get and Wait block until
// the keys exist or the timeout passes (DeadlineExceeded). Add treats the
// value as a decimal int64 counter (creating it at 0) and returns the new
// value.
//
// Implementations:
//   InMemoryStore - one process, thread-safe; for N ranks as N threads.
//   PrefixStore   - scopes every key of a wrapped store under "prefix/".
//   AbortableStore - cuts a wrapped store's waits short when an
//                   AbortSignal fires (Aborted).
//   GrpcStore     - the coordinator's Cluster Store* RPCs (grpc_store.h).
//
// Thread safety: every method of every implementation may be called from
// any thread concurrently. Errors are Status values, never exceptions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/comm/abort_signal.h"

namespace tandem::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Set(std::string_view key, std::string_view value) = 0;
  // Blocks until `key` exists; DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  virtual absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) = 0;
  // Blocks until every key exists; DeadlineExceeded after `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Returns whether the key existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
};

// Thread-safe in-process store.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> data_ ABSL_GUARDED_BY(mu_);
};

// Scopes keys as "<prefix>/<key>" in `base` (not owned; must outlive this).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store* base) : prefix_(std::move(prefix)), base_(base) {}
  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

 private:
  std::string Key(std::string_view key) const;
  const std::string prefix_;
  Store* const base_;
};

// Forwards to `base` (not owned; must outlive this), but every call fails
// with Aborted once `signal` is aborted, and Get/Wait block on `base` only in
// slices of at most `slice`, checking the signal between them (so an abort
// ends a wait within about one slice). A null signal forwards unchanged.
class AbortableStore final : public Store {
 public:
  AbortableStore(Store* base, std::shared_ptr<AbortSignal> signal,
                 std::chrono::milliseconds slice = std::chrono::milliseconds(200))
      : base_(base), signal_(std::move(signal)), slice_(slice) {}
  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

 private:
  absl::Status CheckAborted() const;
  Store* const base_;
  const std::shared_ptr<AbortSignal> signal_;
  const std::chrono::milliseconds slice_;
};

}  // namespace tandem::comm
