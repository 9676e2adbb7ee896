// ChildProcess: a program started by `tandemctl run --local`. Each child
// runs in its own process group (so SIGTERM/SIGKILL reach anything it
// spawns), gets PR_SET_PDEATHSIG(SIGKILL) (so it dies with tandemctl even if
// tandemctl is SIGKILLed), has stdin on /dev/null, stderr (and stdout unless
// piped) appended to a log file, no other descriptor of tandemctl, and starts
// with an empty signal mask and default signal dispositions. Stop()/StopAll() send SIGTERM, wait up to a
// bound, then SIGKILL, and always reap. Not thread safe: one thread at a time
// uses a ChildProcess.
//
// Which thread may call Start(). The death signal follows the *forking
// thread*, not the process: when the thread that called Start() exits, the
// child is SIGKILLed. So Start() must run on a thread that lives until the
// child has been stopped (the main thread, or a supervisor thread that stops
// its children before it returns).
//
// Forking while gRPC runs is safe. Between fork and execv the child makes
// async-signal-safe calls only (no allocation, no lock another thread may
// hold; argv and descriptors are prepared before fork), then closes every
// descriptor above 2, so it inherits none of gRPC's sockets or files opened
// without O_CLOEXEC. gRPC itself runs no code at fork: its fork support is
// off unless GRPC_ENABLE_FORK_SUPPORT=1, and Debian's libgrpc 1.51 is built
// without pthread_atfork handlers at all (grpc_fork_handlers_auto_register
// only reads that setting; the library imports no __register_atfork), so the
// parent's gRPC threads carry on undisturbed. Of tandemctl's libraries only
// OpenBLAS registers fork handlers (it parks its idle thread pool in the
// parent). Start() may therefore be called before or after gRPC channels
// exist.
#pragma once

#include <csignal>

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct ChildSpec {
  std::string path;               // executable
  std::vector<std::string> args;  // without argv[0]
  std::string log_file;           // stderr (+ stdout unless pipe_stdout)
  bool pipe_stdout = false;       // read it through stdout_fd()
};

class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ChildSpec& spec);
  ~ChildProcess();  // Stop(5 s) when still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  int stdout_fd() const { return stdout_fd_; }  // -1 unless piped; owned here
  // True while the process has not exited (does not reap).
  bool Running();
  // Exit description once exited ("exit 0", "signal 9"); "" while running.
  std::string ExitText();
  // The same with the signal's name ("exit 2", "signal 9: killed",
  // "signal 11: segmentation fault (core dumped)"); "" while running. A
  // SIGKILL while the kernel's OOM killer killed processes of this cgroup
  // says so: "signal 9: killed (out of memory: ...)".
  std::string ExitReason();
  // True once exited with status 0; false while running or after a failure.
  bool ExitedCleanly();
  void Stop(std::chrono::milliseconds grace);
  // SIGKILL to the whole group (when still running) and reap. Blocks until reaped.
  void KillAndReap();

 private:
  ChildProcess() = default;
  void Reap();
  std::string name_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::optional<int64_t> oom_kills_at_start_;  // CgroupOomKills() at Start
};

// How many processes the kernel's OOM killer has killed in this process's
// memory cgroup (the "oom_kill N" line of cgroup v2's memory.events, or of
// v1's memory.oom_control); nullopt where the kernel does not say. Children
// of tandemctl share its cgroup.
std::optional<int64_t> CgroupOomKills();
// The N of the "oom_kill N" line of such a file; nullopt without one.
std::optional<int64_t> ParseOomKillCount(std::string_view text);

// `signal` (SIGTERM unless told) to every child's group, wait up to grace for
// all, SIGKILL the rest, reap all.
void StopAll(const std::vector<ChildProcess*>& children, std::chrono::milliseconds grace, int signal = SIGTERM);

// Finds a Tandem program: $env_var, next to this executable, the build-tree
// layout (server/, worker/daemon/ relative to server/cli/), then $PATH.
absl::StatusOr<std::string> FindProgram(const std::string& name, const std::string& env_var);

}  // namespace tandem::cli
