// WorkerSupervisor: the local workers of `tandemctl run --local`, started,
// watched and restarted on failure, like systemd's Restart=on-failure.
//
// Contract.
// - Start() forks every member (its ChildSpec: program, arguments, log file).
// - Until AllowRestarts() every exit is final (a worker that dies during
//   start-up fails the run; a restart would not fix its cause). After it, a
//   member that exits with a non-zero status or is killed by a signal is
//   started again with the same spec (same --name, so it registers as the
//   same worker; the log file is appended to) after a backoff of
//   initial_backoff doubling up to max_backoff, at most max_restarts times
//   per member over the supervisor's life. A member that exits 0 is not
//   restarted. With restart == false nothing is ever restarted.
// - Every exit the supervisor sees and every restart it makes is reported
//   to `on_event` and kept: restarts() lists the restarts made.
// - Stop() ends supervision before it stops anything (an exit it causes is
//   never restarted), then stops every member - including one restarted a
//   moment before - with SIGTERM, `stop_grace`, SIGKILL, and reaps them all.
//
// Threads. One supervisor thread, started by Start() and joined by Stop(),
// is the only thread that forks, waits for, signals or reaps a member: the
// initial forks, the restarts and the final stop all happen on it, so every
// member's PR_SET_PDEATHSIG parent is a thread that outlives it (see
// child_process.h; forking there while gRPC runs is safe). Public methods
// are thread safe; the member table and the records are guarded by mu_.
// on_event runs on the supervisor thread, never with mu_ held, and never
// after Stop() has returned; it must not call Stop().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/cli/child_process.h"

namespace tandem::cli {

struct SupervisorOptions {
  bool restart = true;                             // false: --no-restart
  int max_restarts = 5;                            // per member, over the run
  std::chrono::milliseconds initial_backoff{500};  // before the first restart
  std::chrono::milliseconds max_backoff{4000};     // doubling stops here
  std::chrono::milliseconds poll{100};             // how often exits are checked
  std::chrono::milliseconds stop_grace{15000};     // SIGTERM -> SIGKILL in Stop()
};

// The wait before restart number n + 1 (n restarts made so far).
std::chrono::milliseconds RestartBackoff(const SupervisorOptions& options, int n);

struct SupervisedMember {
  std::string name;  // e.g. "local-1"
  ChildSpec spec;
};

struct SupervisorEvent {
  enum class Kind {
    kRestarted,      // exited with a failure; started again (restart of max_restarts)
    kRestartFailed,  // the new process could not be started (error); retried within the bound
    kGaveUp,         // exited with a failure; the bound is reached: not restarted
    kExited,         // exited and not restarted: clean exit, restarts off or not yet allowed
  };
  Kind kind;
  std::string member;
  std::string reason;  // how it exited: "signal 9: killed", "exit 1"
  std::string error;   // kRestartFailed: why the start failed
  double time = 0;     // seconds since the epoch
  int restart = 0;     // kRestarted/kRestartFailed: this attempt's number (1-based)
  int max_restarts = 0;
  std::string note;  // kExited: why not restarted ("clean exit", "--no-restart", "during start-up")
  pid_t pid = -1;    // kRestarted: the new process
  std::string log_file;
};
// "worker local-1 exited (signal 9: killed); restarted (1 of 5)" and the like.
std::string DescribeEvent(const SupervisorEvent& e);

class WorkerSupervisor {
 public:
  using EventFn = std::function<void(const SupervisorEvent&)>;
  WorkerSupervisor(SupervisorOptions options, EventFn on_event);
  ~WorkerSupervisor();  // Stop()
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  // Starts the supervisor thread and, on it, every member. On error nothing
  // is left running and the supervisor is stopped. Call once.
  absl::Status Start(std::vector<SupervisedMember> members);
  void AllowRestarts();
  // The members that have exited and will not be restarted (their last
  // kExited or kGaveUp event), in member order; empty while every member is
  // running or about to be restarted.
  std::vector<SupervisorEvent> Down() const;
  std::vector<SupervisorEvent> restarts() const;  // kRestarted events, in order
  int restart_count() const;
  // Stops supervising, then every member (see the contract). Idempotent.
  void Stop();

 private:
  struct Slot {
    SupervisedMember member;
    std::unique_ptr<ChildProcess> child;  // null while waiting for a restart or after giving up
    int restarts = 0;                     // attempts made (a failed start counts)
    std::optional<std::chrono::steady_clock::time_point> restart_at;
    std::string reason;                   // how it last exited
    std::optional<SupervisorEvent> down;  // set when it will not come back
  };
  void Run(std::vector<SupervisedMember> members);
  void CheckLocked(std::vector<SupervisorEvent>* events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SupervisorOptions options_;
  const EventFn on_event_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the initial forks are done
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);
  bool restarts_allowed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SupervisorEvent> restarts_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // touched by the owner's thread only (Start, Stop)
};

}  // namespace tandem::cli
