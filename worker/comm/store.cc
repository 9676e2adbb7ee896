#include "worker/comm/store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"

namespace tandem::comm {

absl::Status InMemoryStore::Set(std::string_view key, std::string_view value) {
  absl::MutexLock lock(&mu_);
  data_[std::string(key)] = std::string(value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(std::string_view key, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return data_.find(key) != data_.end(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), absl::FromChrono(timeout))) {
    return absl::DeadlineExceededError(
        absl::StrCat("store: key '", std::string(key), "' not set within ", timeout.count(), " ms"));
  }
  return data_.find(key)->second;
}

absl::StatusOr<int64_t> InMemoryStore::Add(std::string_view key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  int64_t value = 0;
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(absl::StrCat("store: key '", std::string(key), "' does not hold an integer"));
  }
  value += delta;
  data_[std::string(key)] = absl::StrCat(value);
  return value;
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const auto& k : keys) {
      if (data_.find(k) == data_.end()) return false;
    }
    return true;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), absl::FromChrono(timeout))) {
    return absl::DeadlineExceededError(absl::StrCat("store: keys not all set within ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> InMemoryStore::Delete(std::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  data_.erase(it);
  return true;
}

std::string PrefixStore::Key(std::string_view key) const { return absl::StrCat(prefix_, "/", std::string(key)); }

absl::Status PrefixStore::Set(std::string_view key, std::string_view value) { return base_->Set(Key(key), value); }

absl::StatusOr<std::string> PrefixStore::Get(std::string_view key, std::chrono::milliseconds timeout) {
  return base_->Get(Key(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(std::string_view key, int64_t delta) { return base_->Add(Key(key), delta); }

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> scoped;
  scoped.reserve(keys.size());
  for (const auto& k : keys) scoped.push_back(Key(k));
  return base_->Wait(scoped, timeout);
}

absl::StatusOr<bool> PrefixStore::Delete(std::string_view key) { return base_->Delete(Key(key)); }

absl::Status AbortableStore::CheckAborted() const {
  if (signal_ != nullptr && signal_->aborted()) {
    return absl::AbortedError("store: rendezvous aborted");
  }
  return absl::OkStatus();
}

absl::Status AbortableStore::Set(std::string_view key, std::string_view value) {
  RETURN_IF_ERROR(CheckAborted());
  return base_->Set(key, value);
}

absl::StatusOr<std::string> AbortableStore::Get(std::string_view key, std::chrono::milliseconds timeout) {
  if (signal_ == nullptr) return base_->Get(key, timeout);
  // Wait in slices, then read (the key exists once Wait succeeded).
  if (absl::Status st = Wait({std::string(key)}, timeout); !st.ok()) {
    if (absl::IsDeadlineExceeded(st)) {
      return absl::DeadlineExceededError(
          absl::StrCat("store: key '", std::string(key), "' not set within ", timeout.count(), " ms"));
    }
    return st;
  }
  RETURN_IF_ERROR(CheckAborted());
  return base_->Get(key, slice_);
}

absl::StatusOr<int64_t> AbortableStore::Add(std::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckAborted());
  return base_->Add(key, delta);
}

absl::Status AbortableStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (signal_ == nullptr) return base_->Wait(keys, timeout);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    RETURN_IF_ERROR(CheckAborted());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const auto slice = std::clamp(left, std::chrono::milliseconds(1), slice_);
    absl::Status st = base_->Wait(keys, slice);
    if (!absl::IsDeadlineExceeded(st)) {
      RETURN_IF_ERROR(CheckAborted());
      return st;
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("store: keys not all set within ", timeout.count(), " ms"));
    }
  }
}

absl::StatusOr<bool> AbortableStore::Delete(std::string_view key) {
  RETURN_IF_ERROR(CheckAborted());
  return base_->Delete(key);
}

}  // namespace tandem::comm
