// WorkerDaemon: the worker side of the Cluster service. It registers with the
// coordinator (host, device, memory, version, data address), holds the Attach
// stream, hands each PhaseCommand to ONE job thread that runs it through
// JobEngine::RunPhase and reports it with ReportPhase (retried on transient
// errors), heartbeats from a timer thread, and reconnects with capped,
// jittered exponential backoff, re-registering with the same identity
// (worker_id + name) whenever the stream ends or the coordinator says
// `reregister`.
//
// Threads (all owned and joined by Run()): the caller's thread runs the
// connection loop and reads the stream (it only hands commands over), one
// heartbeat thread, one job thread. RequestStop() may be called from any
// thread: the current phase gets `shutdown_grace` to finish, then the engine
// is aborted; the phase is reported either way and Run() returns within
// about shutdown_grace + 2 * rpc_timeout. A SETUP in progress is aborted at
// once instead (a leaving worker must not join a new rendezvous; its peers
// recover without it either way). RequestPreempt() is the gentler way out:
// see there.
//
// The channel reconnects with short backoffs (100 ms initial, 1 s maximum;
// 5 s minimum connect timeout), and retries wait on the channel itself
// (WaitForConnected) rather than sleeping, so a restarted coordinator is
// reached right after it listens.
//
// A repeated command id (the coordinator re-issues the phase in flight after
// a restart) is not run twice: the cached report is sent again, or, when the
// command is still running, the duplicate is ignored.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/security/credentials.h>
#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

#include "tandem/v1/cluster.grpc.pb.h"
#include "worker/daemon/backoff.h"
#include "worker/engine/engine.h"

namespace tandem::worker {

struct WorkerDaemonOptions {
  std::string coordinator;     // host:port of the Cluster service
  std::string name;            // stable worker name (default: host name)
  std::string device = "cpu";  // cpu | cuda
  int device_count = 1;        // devices this worker drives
  std::string data_address;    // for collectives; empty = route to coordinator
  std::string node;            // the machine (--node); empty = host name
  // --tier-bandwidth, bytes per second (0 = not given): reported at
  // registration for tandemctl workers and planning.
  double intra_bytes_per_s = 0;
  double inter_bytes_per_s = 0;
  int threads = 0;    // compute threads (0 = all cores)
  double speed = 0;   // relative speed hint (--speed); 0 = none
  std::string token;  // join token ("" = none)
  // Channel credentials (TLS / mutual TLS); nullptr = plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string version;  // reported to the coordinator
  // Reconnect and report-retry backoff. Capped at 1 s: after a coordinator
  // restart the workers are back within about a second of it listening.
  BackoffPolicy reconnect{std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};
  std::chrono::milliseconds rpc_timeout{10000};
  std::chrono::milliseconds shutdown_grace{20000};
  // RequestPreempt() in a job: how long to keep working for a release.
  std::chrono::milliseconds preempt_timeout{25000};
  std::chrono::milliseconds report_retry_limit{600000};
  int max_message_bytes = 64 << 20;
};

// Makes the engine once the coordinator has assigned the worker id (before
// the first command can arrive). `credential` returns the worker's current
// credential (for the engine's own calls to the coordinator).
using EngineFactory =
    std::function<std::unique_ptr<JobEngine>(const std::string& worker_id, std::function<std::string()> credential)>;

class WorkerDaemon {
 public:
  WorkerDaemon(WorkerDaemonOptions options, EngineFactory engine_factory);
  ~WorkerDaemon();
  WorkerDaemon(const WorkerDaemon&) = delete;
  WorkerDaemon& operator=(const WorkerDaemon&) = delete;

  // Blocks until RequestStop() (then OK) or a fatal error (the coordinator
  // rejected our credentials or our registration as invalid).
  absl::Status Run();
  // Thread safe, idempotent; not async-signal safe (call it from a thread
  // that waited for the signal).
  void RequestStop();
  // Graceful preemption (SIGTERM): in a job, the worker keeps running phases
  // and heartbeats `preempting`; the coordinator checkpoints and hands it over
  // at the next step boundary, then releases it and the daemon stops. Stops at
  // once when the worker holds no job, and after `preempt_timeout` at the
  // latest. Thread safe; not async-signal safe.
  void RequestPreempt();

  std::string worker_id() const;

 private:
  absl::Status Register();
  // SETUP: logs the job's memory estimate against this worker's usable
  // memory (a warning when it does not fit).
  void LogMemoryEstimate(const tandem::v1::PhaseCommand& cmd);
  // engine_->RunPhase, with std::bad_alloc turned into a phase error.
  absl::Status RunPhaseCatchingOutOfMemory(const tandem::v1::PhaseCommand& cmd, tandem::v1::ReportPhaseRequest* report);
  // Holds the Attach stream until it ends; returns its final status.
  grpc::Status AttachOnce();
  void Dispatch(const tandem::v1::WorkerCommand& cmd);
  void HeartbeatLoop();
  void JobLoop();
  void RunCommand(const tandem::v1::PhaseCommand& cmd);
  void SendReport(const tandem::v1::ReportPhaseRequest& report);
  void CancelAttach(const std::string& why);
  // Sleeps up to d; returns early (false) when a stop is requested.
  bool SleepUnlessStopping(std::chrono::milliseconds d);
  // Backoff before retrying a failed call: when the channel is down, waits up
  // to d for it to connect, polling it, and returns true as soon as it is
  // (retry at once); when it is up, sleeps d. With stop_early, returns when a
  // stop is requested.
  bool WaitForCoordinator(std::chrono::milliseconds d, bool stop_early);
  void PrepareContext(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;

  const WorkerDaemonOptions options_;
  EngineFactory engine_factory_;
  std::unique_ptr<JobEngine> engine_;  // set once, before the job thread starts
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::Cluster::Stub> stub_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> job_thread_exit_{false};

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled on stop, new commands, phase end
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::string credential_ ABSL_GUARDED_BY(mu_);  // from RegisterWorker; sent with every later call
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* attach_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t heartbeat_ms_ ABSL_GUARDED_BY(mu_) = 1000;
  std::deque<tandem::v1::PhaseCommand> queue_ ABSL_GUARDED_BY(mu_);
  std::string running_command_id_ ABSL_GUARDED_BY(mu_);
  bool running_setup_ ABSL_GUARDED_BY(mu_) = false;  // the running command is a SETUP
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool preempting_ ABSL_GUARDED_BY(mu_) = false;
  bool preempt_announced_ ABSL_GUARDED_BY(mu_) = false;  // a heartbeat said so
  absl::Time preempt_deadline_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Last finished command and its report (resent on a repeated command id).
  std::string last_command_id_ ABSL_GUARDED_BY(mu_);
  tandem::v1::ReportPhaseRequest last_report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::worker
