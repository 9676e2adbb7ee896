// Prometheus text metrics and health over HTTP (cpp-httplib) on a separate
// port: /metrics, /healthz (the process serves), /readyz (state loaded and
// gRPC serving). RenderMetrics is a pure function of a snapshot.
// MetricsServer owns its listener thread; Stop() joins it. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/job.pb.h"

namespace httplib {
class Server;
}

namespace tandem::server {

std::string RenderMetrics(const std::vector<tandem::v1::Job>& jobs,
                          const std::map<tandem::v1::WorkerState, int>& workers);

class MetricsServer {
 public:
  MetricsServer();
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // listen "host:port" (port 0 = ephemeral).
  absl::Status Start(const std::string& listen, std::function<std::string()> metrics,
                     std::function<bool()> ready);
  int port() const { return port_; }
  void Stop();

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tandem::server
