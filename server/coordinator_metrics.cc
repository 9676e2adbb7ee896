#include "server/coordinator_metrics.h"

#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "server/jobs/phase_plan.h"

namespace tandem::server {
namespace {

// Phases take milliseconds (score) to many minutes (rollout of a large model).
const std::vector<double> kPhaseBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                          5,     10,   25,    60,   150, 300,  600, 1800};
// Unary RPCs: sub-millisecond (heartbeats) to seconds (a long-polled store get).
const std::vector<double> kRpcBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};

constexpr char kBytesSentPrefix[] = "bytes_sent_";

// The services the coordinator serves, whose methods may be labels.
const std::set<std::string>& KnownServices() {
  static const auto* services = new std::set<std::string>{
      "tandem.v1.Control", "tandem.v1.Cluster", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"};
  return *services;
}

// "/pkg.Service/Method" -> {service, method}; {"other", "other"} for
// anything not served here (a client can send any path).
std::pair<std::string, std::string> SplitMethod(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/');
  if (parts.size() != 3 || !parts[0].empty() || !KnownServices().count(parts[1]) || parts[2].empty() ||
      parts[2].size() > 64) {
    return {"other", "other"};
  }
  for (char c : parts[2]) {
    if (!std::isalnum(static_cast<unsigned char>(c))) return {"other", "other"};
  }
  return {parts[1], parts[2]};
}

const char* CodeName(int code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

}  // namespace

const std::vector<std::string>& CollectiveKindNames() {
  static const auto* kinds = new std::vector<std::string>{"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                          "barrier",   "send_recv",      "all_scan",  "all_to_all"};
  return *kinds;
}

const std::vector<std::string>& TierNames() {
  static const auto* tiers = new std::vector<std::string>{"intra_node", "inter_node"};
  return *tiers;
}

CoordinatorMetrics::CoordinatorMetrics()
    : steps_("tandem_steps_total",
             "Training steps completed, by job kind (a step redone after a recovery counts again).", {"kind"}),
      phase_seconds_("tandem_phase_duration_seconds",
                     "Wall time of a phase from issue to the last rank's report, by phase kind.", {"phase"},
                     kPhaseBounds),
      checkpoint_seconds_("tandem_checkpoint_duration_seconds",
                          "Wall time a job spends in its checkpoint phase (snapshot; the disk write continues in the "
                          "background).",
                          {}, kPhaseBounds),
      checkpoints_("tandem_checkpoints_total", "Checkpoints published complete on disk.", {}),
      checkpoint_bytes_("tandem_checkpoint_bytes_total",
                        "Bytes of the checkpoints published complete on disk (every rank's shard plus the manifest).",
                        {}),
      recoveries_("tandem_recoveries_total", "Job recoveries started (a worker lost or a collective failed).", {}),
      collective_bytes_("tandem_collective_sent_bytes_total",
                        "Bytes sent by all ranks in collectives, by collective kind, as reported with training steps.",
                        {"kind"}),
      tier_bytes_("tandem_collective_tier_sent_bytes_total",
                  "Bytes sent by all ranks in collectives, by network tier (intra_node, inter_node: the ranks' "
                  "--node) and collective kind, as reported with training steps.",
                  {"tier", "kind"}),
      rpc_seconds_("tandem_grpc_server_handling_seconds",
                   "Latency of unary gRPC calls served by the coordinator, by service and method.",
                   {"grpc_service", "grpc_method"}, kRpcBounds),
      rpcs_("tandem_grpc_server_handled_total", "gRPC calls the coordinator finished, by service, method and code.",
            {"grpc_service", "grpc_method", "grpc_code"}) {
  // Every bounded label value exists from the start (at 0), so a rate() or
  // a dashboard panel has a series before the first event.
  for (int k = tandem::v1::JobKind_MIN; k <= tandem::v1::JobKind_MAX; ++k) {
    if (k == tandem::v1::JOB_KIND_UNSPECIFIED || !tandem::v1::JobKind_IsValid(k)) continue;
    steps_.Add({common::KindName(static_cast<tandem::v1::JobKind>(k))}, 0);
  }
  for (int p = tandem::v1::Phase_MIN; p <= tandem::v1::Phase_MAX; ++p) {
    if (p == tandem::v1::PHASE_UNSPECIFIED || !tandem::v1::Phase_IsValid(p)) continue;
    phase_seconds_.Touch({PhaseName(static_cast<tandem::v1::Phase>(p))});
  }
  checkpoint_seconds_.Touch({});
  checkpoints_.Add({}, 0);
  checkpoint_bytes_.Add({}, 0);
  recoveries_.Add({}, 0);
  for (const auto& kind : CollectiveKindNames()) collective_bytes_.Add({kind}, 0);
  for (const auto& tier : TierNames()) {
    for (const auto& kind : CollectiveKindNames()) tier_bytes_.Add({tier, kind}, 0);
  }
}

CoordinatorMetrics& CoordinatorMetrics::Global() {
  static auto* metrics = new CoordinatorMetrics();
  return *metrics;
}

void CoordinatorMetrics::PhaseCompleted(tandem::v1::Phase phase, double seconds,
                                        const std::map<int, tandem::v1::ReportPhaseRequest>& reports) {
  if (!tandem::v1::Phase_IsValid(phase) || phase == tandem::v1::PHASE_UNSPECIFIED) return;
  phase_seconds_.Observe({PhaseName(phase)}, seconds);
  if (phase == tandem::v1::PHASE_CHECKPOINT) checkpoint_seconds_.Observe({}, seconds);
  for (const auto& [rank, report] : reports) {
    for (const auto& kind : CollectiveKindNames()) {
      auto it = report.metrics().extra().find(kBytesSentPrefix + kind);
      if (it != report.metrics().extra().end()) collective_bytes_.Add({kind}, it->second);
      for (const auto& tier : TierNames()) {
        auto t = report.metrics().extra().find(absl::StrCat("tier_sent_", tier, "_", kind));
        if (t != report.metrics().extra().end()) tier_bytes_.Add({tier, kind}, t->second);
      }
    }
  }
}

void CoordinatorMetrics::StepCompleted(tandem::v1::JobKind kind) {
  if (!tandem::v1::JobKind_IsValid(kind) || kind == tandem::v1::JOB_KIND_UNSPECIFIED) return;
  steps_.Increment({common::KindName(kind)});
}

void CoordinatorMetrics::CheckpointPublished(int64_t bytes) {
  checkpoints_.Increment({});
  checkpoint_bytes_.Add({}, static_cast<double>(bytes));
}

void CoordinatorMetrics::RecoveryStarted() { recoveries_.Increment({}); }

void CoordinatorMetrics::RpcFinished(const std::string& method, int grpc_code, bool unary, double seconds) {
  auto [service, name] = SplitMethod(method);
  rpcs_.Increment({service, name, CodeName(grpc_code)});
  if (unary) rpc_seconds_.Observe({service, name}, seconds);
}

std::string CoordinatorMetrics::Render() const {
  std::string out;
  steps_.Render(&out);
  phase_seconds_.Render(&out);
  checkpoint_seconds_.Render(&out);
  checkpoints_.Render(&out);
  checkpoint_bytes_.Render(&out);
  recoveries_.Render(&out);
  collective_bytes_.Render(&out);
  tier_bytes_.Render(&out);
  rpc_seconds_.Render(&out);
  rpcs_.Render(&out);
  return out;
}

}  // namespace tandem::server
