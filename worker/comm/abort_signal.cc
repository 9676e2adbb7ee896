#include "worker/comm/abort_signal.h"

#include <utility>

namespace tandem::comm {

AbortSignal::Registration& AbortSignal::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    signal_ = std::move(other.signal_);
    id_ = other.id_;
    other.id_ = 0;
  }
  return *this;
}

void AbortSignal::Registration::Reset() {
  if (signal_ != nullptr && id_ != 0) signal_->Unregister(id_);
  signal_.reset();
  id_ = 0;
}

void AbortSignal::Abort() {
  absl::MutexLock lock(&mu_);
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& [id, fn] : callbacks_) fn();
}

AbortSignal::Registration AbortSignal::Register(const std::shared_ptr<AbortSignal>& self, std::function<void()> fn) {
  if (self == nullptr || !fn) return Registration();
  absl::MutexLock lock(&self->mu_);
  if (self->aborted()) {
    fn();
    return Registration();
  }
  const uint64_t id = self->next_id_++;
  self->callbacks_.emplace(id, std::move(fn));
  return Registration(self, id);
}

void AbortSignal::Unregister(uint64_t id) {
  // Taking the lock waits for an Abort() that is running callbacks.
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
}

}  // namespace tandem::comm
