// SignalWatcher: turns SIGINT/SIGTERM/SIGHUP into a callback on a dedicated
// thread. The handler only writes the signal number to a pipe (async-signal
// safe), so it works whichever thread the kernel picks - including threads
// that libraries (OpenBLAS, gRPC) start before main. One instance at a time;
// the destructor restores the previous handlers and joins the thread.
// Child processes get default dispositions back at exec.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>

namespace tandem::cli {

class SignalWatcher {
 public:
  explicit SignalWatcher(std::function<void(int)> on_signal);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;
  int last_signal() const { return last_signal_.load(); }

 private:
  struct sigaction old_[3];
  std::atomic<int> last_signal_{0};
  std::function<void(int)> on_signal_;
  std::thread thread_;
};

}  // namespace tandem::cli
