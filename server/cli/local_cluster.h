// The processes of `tandemctl run --local`: one tandem-coordinator and N
// tandem-worker processes on 127.0.0.1, started and stopped together (see
// child_process.h for the no-orphan rules), plus the small file helpers the
// run directory needs (0600 token files, the tail of a log).
//
// LocalCluster: the calling (main) thread starts and stops the coordinator;
// the workers belong to the WorkerSupervisor and its thread; the monitor
// thread only watches the coordinator. The destructor stops everything.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/cli/child_process.h"
#include "server/cli/job_follow.h"
#include "server/cli/worker_supervisor.h"

namespace tandem::cli {

// How long a stopped child gets between SIGTERM and SIGKILL.
inline constexpr std::chrono::milliseconds kLocalStopGrace{15000};

// 32 random bytes from /dev/urandom, as 64 hex digits.
absl::StatusOr<std::string> RandomToken();
// Writes `content` to `path`, readable by its owner only (0600).
absl::Status WritePrivateFile(const std::filesystem::path& path, const std::string& content);
// The last `max_lines` lines of `path`, each indented by four spaces.
std::string TailOfFile(const std::filesystem::path& path, size_t max_lines);

class LocalCluster {
 public:
  LocalCluster() = default;
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;
  ~LocalCluster() { Shutdown(); }

  // Stops the monitor, the workers (coordinator still up) and then the
  // coordinator. Idempotent.
  void Shutdown();

  // Starts the coordinator (logging to DIR/coordinator.log) and waits for its
  // ready line.
  absl::Status StartCoordinator(const std::string& program, const std::filesystem::path& dir, Canceller* cancel);

  // Starts the workers on the supervisor's thread; on_event runs there.
  // With nodes > 1 worker i declares `--node local-node<i * nodes / n>`
  // (node by node); with nodes == 1 the workers keep their default node.
  absl::Status StartWorkers(const std::string& program, const std::filesystem::path& dir, int n, int nodes,
                            const std::string& device, int threads, const SupervisorOptions& options,
                            WorkerSupervisor::EventFn on_event);

  // Cancels `cancel` when the coordinator dies.
  void StartMonitor(Canceller* cancel);

  // Once every worker has registered: a failure from now on is restarted.
  void AllowRestarts() { supervisor_->AllowRestarts(); }
  // A worker that exited and will not come back (start-up: every exit).
  std::optional<SupervisorEvent> FirstDownWorker() const;
  std::vector<SupervisorEvent> restarts() const;
  std::vector<SupervisorEvent> down_workers() const;

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  bool coordinator_died() const { return coordinator_died_.load(); }
  bool coordinator_running() { return coordinator_ && coordinator_->Running(); }
  const std::filesystem::path& log() const { return log_; }

 private:
  void AppendLog(const std::string& text);

  std::unique_ptr<ChildProcess> coordinator_;
  std::unique_ptr<WorkerSupervisor> supervisor_;
  std::thread drain_;
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  std::atomic<bool> coordinator_died_{false};
  std::string grpc_address_;
  std::string metrics_address_;
  std::filesystem::path log_;
};

}  // namespace tandem::cli
