// AbortSignal: a one-shot, thread-safe "stop waiting" flag shared by
// whoever starts a blocking rendezvous (the engine's SETUP) and whoever may
// need to cut it short (abort_job, the daemon's shutdown).
//
// Contract:
// - Abort() may be called from any thread, any number of times; the first
//   call sets the flag and runs every registered callback once (in
//   registration order, on the calling thread); later calls do nothing.
// - Register(fn) runs fn at once (on the registering thread) if the signal
//   is already aborted, else when Abort() is first called. The returned
//   Registration unregisters on destruction; once it is destroyed, fn is
//   neither running nor will run (destruction waits for a running callback).
// - Callbacks run under the signal's lock: they must be short, must not
//   block on other waits and must not call back into this AbortSignal.
//
// Waits that honour a signal poll aborted() in short slices (see
// AbortableStore in store.h) or register a callback that wakes them
// (GlooCollective shuts its sockets down).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::comm {

class AbortSignal {
 public:
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept { *this = std::move(other); }
    Registration& operator=(Registration&& other) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { Reset(); }
    // Unregisters now (idempotent).
    void Reset();

   private:
    friend class AbortSignal;
    Registration(std::shared_ptr<AbortSignal> signal, uint64_t id) : signal_(std::move(signal)), id_(id) {}
    std::shared_ptr<AbortSignal> signal_;
    uint64_t id_ = 0;
  };

  AbortSignal() = default;
  AbortSignal(const AbortSignal&) = delete;
  AbortSignal& operator=(const AbortSignal&) = delete;

  void Abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // `self` must own this signal (a shared_ptr keeps it alive for the
  // Registration). A null `self` gives an empty Registration and never runs fn.
  static Registration Register(const std::shared_ptr<AbortSignal>& self, std::function<void()> fn);

 private:
  void Unregister(uint64_t id);

  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::comm
