// Prometheus text metrics and health over HTTP (HttpServer: slow clients
// cannot starve the probes) on a separate port: /metrics, /healthz (the
// process serves), /readyz (state loaded, gRPC serving, state store taking
// writes). RenderMetrics is a pure function of a snapshot.
// MetricsServer owns its listener thread; Stop() joins it. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/http_server.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

std::string RenderMetrics(const std::vector<tandem::v1::Job>& jobs,
                          const std::map<tandem::v1::WorkerState, int>& workers);

class MetricsServer {
 public:
  MetricsServer();
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // listen "host:port" (port 0 = ephemeral). add_routes (optional) adds
  // more routes to the same server before it starts (the dashboard).
  absl::Status Start(const std::string& listen, std::function<std::string()> metrics, std::function<bool()> ready,
                     HttpServerOptions options = {}, std::function<void(HttpServer*)> add_routes = nullptr);
  int port() const { return port_; }
  void Stop();

 private:
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
};

}  // namespace tandem::server
