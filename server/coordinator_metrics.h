// The coordinator's operational series for /metrics (docs/operations.md,
// "Metrics", says what each one means): steps, phase and checkpoint
// durations, checkpoint bytes, recoveries, collective bytes and RPC
// latency. Jobs and workers by state are rendered from snapshots
// (metrics_http.h); these are the counters and histograms that accumulate
// over the coordinator's life, fed by one-line hooks in the job driver and
// a gRPC interceptor (grpc_metrics.h).
//
// Labels come from bounded sets only: phase and job kind enums, the
// collective kinds workers report, the coordinator's own RPC methods
// (anything else is "other") and gRPC status codes. No job or worker ids.
// Global() is the process's instance; tests may make their own.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "server/prometheus_metrics.h"
#include "tandem/v1/cluster.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  static CoordinatorMetrics& Global();

  // A phase every rank completed, `seconds` of coordinator wall time from
  // issue to the last report; `reports` are the ranks' reports (collective
  // bytes are summed over them).
  void PhaseCompleted(tandem::v1::Phase phase, double seconds,
                      const std::map<int, tandem::v1::ReportPhaseRequest>& reports);
  // A training step of a job of `kind` finished (a redone step counts again).
  void StepCompleted(tandem::v1::JobKind kind);
  // A checkpoint published complete on disk, the first time it is recorded.
  void CheckpointPublished(int64_t bytes);
  void RecoveryStarted();
  // An RPC that ended: method is gRPC's "/package.Service/Method";
  // latency is recorded for unary calls only (a stream's life is not a latency).
  void RpcFinished(const std::string& method, int grpc_code, bool unary, double seconds);

  std::string Render() const;

  const CounterFamily& steps() const { return steps_; }
  const CounterFamily& collective_bytes() const { return collective_bytes_; }
  const CounterFamily& tier_bytes() const { return tier_bytes_; }
  const CounterFamily& checkpoint_bytes() const { return checkpoint_bytes_; }
  const CounterFamily& recoveries() const { return recoveries_; }
  const HistogramFamily& phase_seconds() const { return phase_seconds_; }
  const HistogramFamily& rpc_seconds() const { return rpc_seconds_; }
  const CounterFamily& rpcs() const { return rpcs_; }

 private:
  CounterFamily steps_;
  HistogramFamily phase_seconds_;
  HistogramFamily checkpoint_seconds_;
  CounterFamily checkpoints_;
  CounterFamily checkpoint_bytes_;
  CounterFamily recoveries_;
  CounterFamily collective_bytes_;
  CounterFamily tier_bytes_;
  HistogramFamily rpc_seconds_;
  CounterFamily rpcs_;
};

// The collective kinds workers report as metrics.extra["bytes_sent_<kind>"]
// (worker/comm/collective.h, CollectiveKindName).
const std::vector<std::string>& CollectiveKindNames();
// Network tiers of metrics.extra["tier_sent_<tier>_<kind>"]
// (worker/comm/tiered_collective.h, TierName).
const std::vector<std::string>& TierNames();

}  // namespace tandem::server
