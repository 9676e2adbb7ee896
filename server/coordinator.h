// Coordinator: wires the managers (state store, membership, kv store, job
// manager) to the gRPC services (Control, Cluster, grpc.health.v1,
// reflection) and the HTTP metrics server, and runs the lease reaper.
// The one place where the pieces meet; coordinator_main.cc only parses
// flags and calls Start/Shutdown.
// Start and Shutdown are called from one thread; the rest is thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "server/clock.h"
#include "tandem/v1/config.pb.h"

namespace grpc {
class Server;
}

namespace tandem::common {
class TokenAuthenticator;
}

namespace tandem::server {

class StateStore;
class Membership;
class KvStore;
class JobManager;
class ControlService;
class ClusterService;
class MetricsServer;
class PhaseTimeline;
class Dashboard;

class Coordinator {
 public:
  explicit Coordinator(tandem::v1::CoordinatorConfig config, std::unique_ptr<Clock> clock = nullptr);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Reads tokens and TLS files, opens and loads the state store, starts
  // serving. Errors name the file or address at fault.
  absl::Status Start();
  // Stops accepting, ends streams, persists, joins every thread; bounded by
  // config.shutdown_grace_ms (plus the drivers' sub-second wake-up).
  void Shutdown();

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }
  std::string grpc_address() const;  // connectable, e.g. 127.0.0.1:PORT
  // "tandem-coordinator listening grpc=HOST:PORT metrics=HOST:PORT"
  std::string ReadyLine() const;
  // For tests (fault injection on the state store).
  StateStore* store_for_test() { return store_.get(); }

  JobManager* jobs() { return jobs_.get(); }
  Membership* membership() { return membership_.get(); }
  KvStore* kv() { return kv_.get(); }

 private:
  void ReaperLoop();

  tandem::v1::CoordinatorConfig config_;
  std::unique_ptr<Clock> clock_;
  std::unique_ptr<common::TokenAuthenticator> auth_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<PhaseTimeline> timeline_;  // the dashboard's phase spans
  std::unique_ptr<ControlService> control_;
  std::unique_ptr<ClusterService> cluster_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<MetricsServer> metrics_;
  std::thread reaper_;
  absl::Notification stop_reaper_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> serving_{false};
  bool started_ = false;
  bool shut_down_ = false;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
};

}  // namespace tandem::server
