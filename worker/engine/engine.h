// JobEngine: what a worker runs for the job it is assigned. The worker
// daemon (worker/daemon) receives PhaseCommands on its Attach stream and hands
// each one to the engine on the worker's job thread; the engine executes the
// phase with the compute core, collectives and ZeRO, and fills the report.
//
// Thread safety: RunPhase is called from one thread at a time. Abort() may be
// called from any thread; it makes a RunPhase in progress (and every
// collective it waits on) return an error promptly.
#pragma once

#include <memory>
#include <string>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/comm/store.h"

namespace tandem::worker {

struct EngineOptions {
  std::string coordinator_address;         // for the rendezvous store
  std::string auth_token;                  // join token for Store RPCs
  std::string tls_ca;                      // PEM CA for the coordinator channel ("" = insecure)
  std::string tls_cert, tls_key;           // client certificate and key (mutual TLS)
  std::string data_address = "127.0.0.1";  // interface for gloo tcp
  int num_threads = 0;                     // compute threads (0 = all cores)
  // Relative speed hint (tandem-worker --speed) for cluster.shard_by_speed;
  // 0 = none (calibrated at SETUP; speed_shares.h).
  double speed = 0;
  std::string device = "cpu";  // cpu | cuda
  std::string worker_id;
  // The worker's current credential (sent with Store RPCs); unset: none.
  std::function<std::string()> worker_credential;
  // Seam for tests: makes the rendezvous store of (job, generation). Unset:
  // the coordinator's store over gRPC (comm::MakeGrpcStore).
  std::function<absl::StatusOr<std::unique_ptr<comm::Store>>(const std::string& job_id, int64_t generation)>
      store_factory;
  // Collective timeout (ms) for the job's communicator.
  int64_t collective_timeout_ms = 60000;
};

class JobEngine {
 public:
  virtual ~JobEngine() = default;
  // Executes cmd and fills the phase's result in `report`: metrics, values,
  // the typed setup or checkpoint result, checkpoints published since the
  // last call, log lines, peak memory. The returned status is the outcome;
  // a failure carries its kind (common/phase_failure.h). The caller owns the
  // report's envelope (identity, ok, error, failure: worker/daemon/
  // report_envelope.h) and answering a re-sent command: every call runs.
  virtual absl::Status RunPhase(const tandem::v1::PhaseCommand& cmd, tandem::v1::ReportPhaseRequest* report) = 0;
  // Drops all state of the current job (communicators aborted first).
  virtual void Abort() = 0;
  // Job the engine currently holds state for ("" when none).
  virtual std::string current_job() const = 0;
};

// The real engine: SFT and GRPO jobs on the CPU (or CUDA) backend.
std::unique_ptr<JobEngine> MakeJobEngine(const EngineOptions& options);

}  // namespace tandem::worker
