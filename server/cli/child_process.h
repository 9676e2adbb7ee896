// ChildProcess: a program started by `tandemctl run --local`. Each child
// runs in its own process group (so SIGTERM/SIGKILL reach anything it
// spawns), gets PR_SET_PDEATHSIG(SIGKILL) (so it dies with tandemctl even if
// tandemctl is SIGKILLed), has stdin on /dev/null, stderr (and stdout unless
// piped) appended to a log file, and starts with an empty signal mask.
// Start() must be called from the main thread (the death signal follows the
// forking thread) and before gRPC channels exist (fork + exec only; the
// child runs async-signal-safe calls alone). Stop()/StopAll() send SIGTERM,
// wait up to a bound, then SIGKILL, and always reap. Not thread safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct ChildSpec {
  std::string path;                // executable
  std::vector<std::string> args;   // without argv[0]
  std::string log_file;            // stderr (+ stdout unless pipe_stdout)
  bool pipe_stdout = false;        // read it through stdout_fd()
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
};

// SIGTERM to every child's group, wait up to grace for all, SIGKILL the rest, reap all.
void StopAll(const std::vector<ChildProcess*>& children, std::chrono::milliseconds grace);

// Finds a Tandem program: $env_var, next to this executable, the build-tree
// layout (server/, worker/daemon/ relative to server/cli/), then $PATH.
absl::StatusOr<std::string> FindProgram(const std::string& name, const std::string& env_var);

}  // namespace tandem::cli
