// Test support (tests/support): a cluster of real tandem-coordinator and
// tandem-worker processes on 127.0.0.1 (ephemeral ports) for C++ tests,
// started, signalled and stopped by the one launcher of test clusters,
// tests/support/cluster.py, through its command line; what it prints
// (cluster.json: ports, pids, token and log paths) is read back here.
//
// Not thread safe: one test thread drives it. The destructor tears the
// cluster down (TERM, then KILL after 10 s); the run directory stays.
// Failures are Status values naming the launcher's command and its error.
#ifndef TANDEM_TESTS_SUPPORT_REAL_CLUSTER_H_
#define TANDEM_TESTS_SUPPORT_REAL_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::test_support {

struct RealClusterOptions {
  std::string dir;                            // the run directory (created)
  std::string bin_dir;                        // tandem-coordinator, tandem-worker, tandemctl
  std::string launcher;                       // path of tests/support/cluster.py
  int workers = 2;                            // named w0, w1, ...
  std::vector<std::string> coordinator_args;  // extra tandem-coordinator flags
  std::vector<std::string> worker_args;       // extra tandem-worker flags (every worker)
  double timeout_s = 60;                      // each wait of the launcher
};

class RealCluster {
 public:
  // Starts the coordinator and the workers and waits until every worker is IDLE.
  static absl::StatusOr<std::unique_ptr<RealCluster>> Up(const RealClusterOptions& options);
  ~RealCluster();
  RealCluster(const RealCluster&) = delete;
  RealCluster& operator=(const RealCluster&) = delete;

  const nlohmann::json& description() const { return desc_; }  // cluster.json, as last read
  std::string grpc_address() const { return desc_.value("grpc", ""); }
  std::string metrics_address() const { return desc_.value("metrics", ""); }
  std::string admin_token() const;  // the content of admin_token_file
  int Pid(const std::string& member) const;

  // Sends sig to the member ("coordinator" or a worker's name) and waits until
  // it ended; its exit code (128+N for signal N).
  absl::StatusOr<int> Kill(const std::string& member, int sig);
  // The member again with the flags it had (the coordinator on its old port);
  // a worker is awaited until IDLE when wait is set.
  absl::Status Restart(const std::string& member, bool wait);
  // Until every named worker is in state (IDLE, BUSY, LOST, ...).
  absl::Status WaitWorkers(const std::vector<std::string>& names, const std::string& state);
  absl::Status Down();

 private:
  explicit RealCluster(RealClusterOptions options) : options_(std::move(options)) {}
  // Runs `cluster.py CMD --dir DIR ARGS...`; its stdout, or its error.
  absl::StatusOr<std::string> Run(const std::string& cmd, const std::vector<std::string>& args);
  absl::Status Refresh();  // reads cluster.json again

  RealClusterOptions options_;
  nlohmann::json desc_;
  bool down_ = false;
};

}  // namespace tandem::test_support

#endif  // TANDEM_TESTS_SUPPORT_REAL_CLUSTER_H_
