// The job engine: one JobContext at a time, phases dispatched by kind. It
// fills each phase's result; the worker daemon seals the report (identity,
// outcome, typed failure) and answers a re-sent command from its cache.
#include <mutex>
#include <optional>

#include "common/phase_failure.h"
#include "worker/engine/disagg.h"
#include "worker/engine/engine.h"
#include "worker/engine/live_restore.h"
#include "worker/engine/memory_probe.h"
#include "worker/engine/peer_snapshot.h"
#include "worker/engine/phases.h"

namespace tandem::worker {

namespace {

using tandem::v1::Phase;

class JobEngineImpl final : public JobEngine {
 public:
  explicit JobEngineImpl(EngineOptions options) : options_(std::move(options)) {}

  absl::Status RunPhase(const tandem::v1::PhaseCommand& cmd, ReportPhaseRequest* report) override {
    ResetPeakRss();
    absl::Status st = Dispatch(cmd, report);
    {
      // Checkpoints published in the background since the last report.
      std::lock_guard<std::mutex> lock(mu_);
      if (ctx_) {
        absl::Status ck = FinishCheckpoints(*ctx_, report, /*wait=*/false);
        if (st.ok() && !ck.ok()) st = ck;
        if (ctx_->device != nullptr) {
          // Bytes the job holds in its device's memory after the phase
          // (constant in steady state: the hot path allocates nothing).
          const double bytes = static_cast<double>(ctx_->device->memory->allocated_bytes());
          (*report->mutable_values())["device_bytes"] = bytes;
          if (!ctx_->device->host_memory()) (*report->mutable_metrics()->mutable_extra())["device_bytes"] = bytes;
        }
      }
    }
    report->set_peak_memory_bytes(PeakRssBytes());
    report->mutable_metrics()->set_peak_memory_bytes(PeakRssBytes());
    return st;
  }

  void Abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (setup_abort_) setup_abort_->Abort();  // a SETUP in progress
    if (ctx_ && ctx_->abort) ctx_->abort->Abort();
    if (ctx_ && ctx_->collective) ctx_->collective->Abort();
    if (ctx_ && ctx_->disagg) ctx_->disagg->Abort();
    aborted_ = true;
  }

  std::string current_job() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return ctx_ ? ctx_->assignment.job_id() : std::string();
  }

 private:
  absl::Status Dispatch(const tandem::v1::PhaseCommand& cmd, ReportPhaseRequest* report) {
    if (cmd.phase() == tandem::v1::PHASE_SETUP) {
      std::optional<LiveState> live;
      if (cmd.assignment().live_restore()) {
        // Degraded continuation: the previous generation's state is kept
        // (live_restore.h); its context goes away once the state is out.
        std::unique_ptr<JobContext> old = Take();
        live = old ? TakeLiveState(*old, cmd.assignment().job_id()) : LiveState::Missing("holds no state of this job");
      }
      Drop();
      auto ctx = std::make_unique<JobContext>();
      peer_.KeepOnly(cmd.assignment().job_id());
      ctx->peer = &peer_;
      // Abort() reaches this SETUP through the signal: its store waits, the
      // rendezvous and the communicator it makes (comm/abort_signal.h).
      ctx->abort = std::make_shared<comm::AbortSignal>();
      {
        std::lock_guard<std::mutex> lock(mu_);
        setup_abort_ = ctx->abort;
      }
      absl::Status st = SetupJob(options_, cmd.assignment(), *ctx, report, live ? &*live : nullptr);
      bool aborted = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        setup_abort_.reset();
        aborted = ctx->abort->aborted();
        if (st.ok() && !aborted) {
          ctx_ = std::move(ctx);
          aborted_ = false;
          return absl::OkStatus();
        }
      }
      if (ctx) ctx->abort->Abort();  // nothing of this SETUP keeps waiting
      ctx.reset();                   // outside the lock
      if (aborted) {
        return absl::AbortedError("SETUP aborted on this worker" +
                                  (st.ok() ? std::string() : " (" + std::string(st.message()) + ")"));
      }
      return st;
    }
    if (cmd.phase() == tandem::v1::PHASE_TEARDOWN) {
      Drop();
      peer_.Clear();
      return absl::OkStatus();
    }
    JobContext* ctx = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ctx = ctx_.get();
      if (aborted_) return absl::AbortedError("job aborted on this worker");
    }
    if (ctx == nullptr || ctx->assignment.job_id() != cmd.job_id() ||
        ctx->assignment.generation() != cmd.generation()) {
      // The coordinator re-issues SETUP through a recovery.
      return common::WithFailureKind(
          absl::FailedPreconditionError("worker holds no state for job " + cmd.job_id() + " generation " +
                                        std::to_string(cmd.generation()) + " (SETUP missing or superseded)"),
          tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    }
    if (ctx->disagg) {  // disaggregated mode: role-specific phases (disagg.h)
      if (auto st = RunDisaggPhase(*ctx, cmd, report)) return *st;
    }
    switch (cmd.phase()) {
      case tandem::v1::PHASE_SFT_STEP:
        return SftStep(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_EVAL:
        return Evaluate(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_ROLLOUT:
        return Rollout(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_SCORE:
        return Score(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_LOGPROBS:
        return Logprobs(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_UPDATE:
        return Update(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_CHECKPOINT:
        return Checkpoint(*ctx, cmd.step(), report);
      case tandem::v1::PHASE_FLUSH_CHECKPOINTS:
        return FinishCheckpoints(*ctx, report, /*wait=*/true);
      case tandem::v1::PHASE_EXPORT: {
        // Checkpoints in flight finish before the job can end.
        if (absl::Status st = FinishCheckpoints(*ctx, report, /*wait=*/true); !st.ok()) return st;
        return ExportModel(*ctx, report);
      }
      default:
        return absl::InvalidArgumentError("phase " + tandem::v1::Phase_Name(cmd.phase()) +
                                          " is not supported by this worker");
    }
  }

  // Detaches the current context with its communicators aborted.
  std::unique_ptr<JobContext> Take() {
    std::unique_ptr<JobContext> old;
    {
      std::lock_guard<std::mutex> lock(mu_);
      old = std::move(ctx_);
    }
    if (old && old->abort) old->abort->Abort();
    if (old && old->collective) old->collective->Abort();
    if (old && old->disagg) old->disagg->Abort();
    return old;
  }

  void Drop() {
    std::unique_ptr<JobContext> old = Take();
    // `old` is destroyed here, outside the lock.
  }

  const EngineOptions options_;
  PeerSnapshots peer_;  // job thread only; survives Abort and re-SETUP
  mutable std::mutex mu_;
  std::unique_ptr<JobContext> ctx_;  // guarded by mu_ for swaps; used by the job thread
  // The abort signal of the SETUP in progress (null otherwise); guarded by mu_.
  std::shared_ptr<comm::AbortSignal> setup_abort_;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<JobEngine> MakeJobEngine(const EngineOptions& options) {
  return std::make_unique<JobEngineImpl>(options);
}

}  // namespace tandem::worker
