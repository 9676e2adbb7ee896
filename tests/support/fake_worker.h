// Test support (tests/support): a worker written against the Cluster service,
// in-process, for the coordinator and recovery tests. It registers (with its
// job and generation when it has one), heartbeats, holds the Attach stream,
// answers every PhaseCommand with a ReportPhase (optionally failing, stalling
// or replaying a cached report), and reconnects with its identity when the
// stream ends, as tandem-worker does. Engine-like answers (restore figures,
// checkpoint paths) come from Options::fill. Every loop ends on Stop().
//
// Contract: hooks (fail, stall, fill) are read by the worker's threads; set
// them before the phase they concern is sent. The destructor stops and joins
// both threads (like kill -9: nothing more is reported, heartbeats stop).
#ifndef TANDEM_TESTS_SUPPORT_FAKE_WORKER_H_
#define TANDEM_TESTS_SUPPORT_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/cluster.grpc.pb.h"

namespace tandem::test_support {

// A client context with `token` as bearer token and a deadline of `ms`.
std::unique_ptr<grpc::ClientContext> AuthContext(const std::string& token, int ms = 5000);

class FakeWorker {
 public:
  struct Options {
    std::string name;
    std::function<std::string()> address;  // the coordinator's (it may move on restart)
    std::string token;                     // join token
    // Replay the stored report when a command id comes again (a coordinator
    // restart re-sends the phase in flight), as the real daemon does.
    bool cache_reports = false;
    // Completes a report (ok, error, phase values); runs after `fail`.
    std::function<void(FakeWorker&, const tandem::v1::PhaseCommand&, tandem::v1::ReportPhaseRequest*)> fill;
  };

  explicit FakeWorker(Options options);
  ~FakeWorker();
  FakeWorker(const FakeWorker&) = delete;
  FakeWorker& operator=(const FakeWorker&) = delete;

  // Ends both threads; nothing more is reported (like kill -9).
  void Stop();

  // true -> report the phase failed with *failure (kind, message).
  std::function<bool(const tandem::v1::PhaseCommand&, tandem::v1::PhaseFailure*)> fail;
  std::function<bool(const tandem::v1::PhaseCommand&)> stall;  // true -> never answer
  std::atomic<bool> heartbeats_on{true};
  std::atomic<bool> preempting{false};  // sent in every heartbeat
  std::atomic<bool> released{false};    // a heartbeat answer had release set

  const std::string& name() const { return options_.name; }
  std::string id();
  std::string credential();
  // Token and this worker's credential, deadline in ms.
  std::unique_ptr<grpc::ClientContext> WorkerContext(int ms = 5000);
  std::vector<std::string> phases();  // "PHASE_SETUP(0)", ... in the order answered
  tandem::v1::Assignment last_assignment();
  int reports_replayed() const { return replayed_; }

 private:
  std::unique_ptr<tandem::v1::Cluster::Stub> Stub();
  void Run();
  void Handle(tandem::v1::Cluster::Stub* stub, const tandem::v1::PhaseCommand& cmd);
  void Heartbeats();

  const Options options_;
  std::atomic<bool> stop_{false};
  std::atomic<int> replayed_{0};
  absl::Mutex mu_;
  std::string id_ ABSL_GUARDED_BY(mu_);
  std::string credential_ ABSL_GUARDED_BY(mu_);
  std::string job_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  tandem::v1::Assignment assignment_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, tandem::v1::ReportPhaseRequest> cache_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> phases_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  std::thread heartbeat_;
};

}  // namespace tandem::test_support

#endif  // TANDEM_TESTS_SUPPORT_FAKE_WORKER_H_
