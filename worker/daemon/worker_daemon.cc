#include "worker/daemon/worker_daemon.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <new>

#include <algorithm>
#include <utility>

#include "common/auth.h"
#include "common/phase_failure.h"
#include "google/protobuf/util/time_util.h"
#include "worker/daemon/host_info.h"
#include "worker/daemon/report_envelope.h"
#include "worker/model/job_model.h"

namespace tandem::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace v1 = tandem::v1;

constexpr size_t kMaxQueuedCommands = 256;
constexpr int kNotFoundRetries = 20;  // report before re-registration finished

v1::DeviceKind DeviceKindOf(const std::string& device) {
  return device == "cuda" ? v1::DEVICE_KIND_CUDA : v1::DEVICE_KIND_CPU;
}

bool IsTransient(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::CANCELLED:
      return true;
    default:
      return false;
  }
}

absl::Status ToAbsl(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options, EngineFactory engine_factory)
    : options_(std::move(options)), engine_factory_(std::move(engine_factory)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  // Detect a dead coordinator on an idle Attach stream, and reconnect fast.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Long reconnect backoffs left workers failing with "Connection refused"
  // for ~14 s after a coordinator restart although it listened again within
  // a second: start connection attempts every <= 1 s (100 ms first).
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is gRPC's MIN_CONNECT_TIMEOUT (how long
  // one attempt may take, doc/connection-backoff.md), not a retry floor: at
  // 100 ms, attempts to a coordinator that had just started were cut off
  // ("tcp handshaker shutdown") for seconds. A refused connect still fails
  // at once, so a generous value does not delay reconnecting.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> creds =
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials();
  channel_ = grpc::CreateCustomChannel(options_.coordinator, creds, args);
  stub_ = v1::Cluster::NewStub(channel_);
}

WorkerDaemon::~WorkerDaemon() { RequestStop(); }

std::string WorkerDaemon::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

void WorkerDaemon::PrepareContext(grpc::ClientContext* ctx, milliseconds timeout) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  {
    absl::MutexLock lock(&mu_);
    common::AddWorkerCredential(ctx, credential_);
  }
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

void WorkerDaemon::RequestPreempt() {
  if (stopping_.load()) return;
  bool in_job = false;
  {
    absl::MutexLock lock(&mu_);
    if (preempting_) return;
    in_job = registered_ && (!job_id_.empty() || !running_command_id_.empty() || !queue_.empty());
    if (in_job && options_.preempt_timeout.count() > 0) {
      preempting_ = true;
      preempt_deadline_ = absl::Now() + absl::FromChrono(options_.preempt_timeout);
      cv_.SignalAll();  // the heartbeat thread says so at once
    }
  }
  if (!in_job || options_.preempt_timeout.count() <= 0) {
    RequestStop();
    return;
  }
  spdlog::info(
      "worker: preempted: asking the coordinator to checkpoint and hand this worker over "
      "(at most {} s; a second signal stops at once)",
      std::chrono::duration_cast<std::chrono::seconds>(options_.preempt_timeout).count());
}

void WorkerDaemon::RequestStop() {
  if (stopping_.exchange(true)) return;
  spdlog::info("worker: stop requested");
  bool abort_setup = false;
  {
    absl::MutexLock lock(&mu_);
    if (attach_ctx_ != nullptr) attach_ctx_->TryCancel();
    cv_.SignalAll();
    abort_setup = running_setup_;
  }
  // The engine was made before the job thread that set running_setup_.
  if (abort_setup && engine_ != nullptr) {
    spdlog::warn("worker: aborting the SETUP in progress (stopping)");
    engine_->Abort();
  }
}

bool WorkerDaemon::SleepUnlessStopping(milliseconds d) {
  const absl::Time until = absl::Now() + absl::Milliseconds(d.count());
  absl::MutexLock lock(&mu_);
  while (!stopping_.load() && absl::Now() < until) cv_.WaitWithDeadline(&mu_, until);
  return !stopping_.load();
}

bool WorkerDaemon::WaitForCoordinator(milliseconds d, bool stop_early) {
  if (channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) {
    // Connected: the call failed for another reason; just back off.
    if (stop_early) {
      SleepUnlessStopping(d);
    } else {
      std::this_thread::sleep_for(d);
    }
    return false;
  }
  // Wait on the channel itself: a failing RPC does not poll it, and gRPC's
  // backup poller notices a completed connect only every 5 s, which made
  // every reconnect after a coordinator restart ~5 s late.
  const auto until = Clock::now() + d;
  while (!(stop_early && stopping_.load())) {
    const auto now = Clock::now();
    if (now >= until) return false;
    const auto slice = std::min<Clock::duration>(until - now, milliseconds(200));
    if (channel_->WaitForConnected(std::chrono::system_clock::now() + slice)) return true;
  }
  return false;
}

void WorkerDaemon::CancelAttach(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return;
  spdlog::warn("worker: reconnecting: {}", why);
  registered_ = false;
  if (attach_ctx_ != nullptr) attach_ctx_->TryCancel();
}

void WorkerDaemon::LogMemoryEstimate(const v1::PhaseCommand& cmd) {
  // The kernel's OOM killer ends the process without a report: this line,
  // the last of the log, then says why.
  v1::JobSpec spec = cmd.assignment().spec();
  spec.mutable_cluster()->set_workers(std::max(1, cmd.assignment().world_size()));
  auto config = model::JobModelConfig(spec);
  if (!config.ok()) return;  // SETUP reports the problem
  const model::MemoryEstimate need = model::EstimateJobMemory(spec, *config);
  const int64_t usable = UsableMemoryBytes();
  if (usable > 0 && need.total > usable) {
    spdlog::warn(
        "worker: job {} needs about {} on this worker (estimate for {} rank(s)), more than the {} MiB it can use: "
        "the allocation may fail, or the kernel's OOM killer may end this process",
        cmd.job_id(), need.Describe(), spec.cluster().workers(), usable >> 20);
  } else {
    spdlog::info("worker: job {} needs about {} on this worker (estimate for {} rank(s)) of {} MiB usable",
                 cmd.job_id(), need.Describe(), spec.cluster().workers(), usable >> 20);
  }
}

absl::Status WorkerDaemon::RunPhaseCatchingOutOfMemory(const v1::PhaseCommand& cmd, v1::ReportPhaseRequest* report) {
  // An allocation the machine cannot satisfy (a job too large for this
  // worker) fails the phase with the reason instead of ending the process
  // with an uncaught std::bad_alloc; the engine's state for the job is
  // dropped, since the failed phase may have left it half updated.
  try {
    return engine_->RunPhase(cmd, report);
  } catch (const std::bad_alloc&) {
    report->Clear();
    engine_->Abort();
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory in ", v1::Phase_Name(cmd.phase()), " on this worker (", UsableMemoryBytes() >> 20,
                     " MiB usable): the job needs more memory than the worker has; use smaller batches or sequences, "
                     "a higher ZeRO stage, or more workers"));
  }
}

absl::Status WorkerDaemon::Register() {
  v1::RegisterWorkerRequest req;
  req.set_name(options_.name);
  req.set_host(HostName());
  req.set_node(options_.node.empty() ? HostName() : options_.node);
  req.set_speed(options_.speed);
  if (options_.intra_bytes_per_s > 0 && options_.inter_bytes_per_s > 0) {
    req.mutable_tier_bandwidth()->set_intra_bytes_per_s(options_.intra_bytes_per_s);
    req.mutable_tier_bandwidth()->set_inter_bytes_per_s(options_.inter_bytes_per_s);
  }
  req.set_device(DeviceKindOf(options_.device));
  req.set_device_count(options_.device_count);
  req.set_memory_bytes(UsableMemoryBytes());
  req.set_version(options_.version);
  req.set_data_address(options_.data_address.empty() ? LocalAddressTowards(options_.coordinator)
                                                     : options_.data_address);
  {
    absl::MutexLock lock(&mu_);
    req.set_worker_id(worker_id_);
    req.set_worker_credential(credential_);
    // What we still hold, so a restarted coordinator can keep us in the job.
    req.set_job_id(job_id_);
    req.set_generation(generation_);
    req.set_last_command_id(last_command_id_);
  }
  v1::RegisterWorkerResponse resp;
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_.rpc_timeout);
  grpc::Status s = stub_->RegisterWorker(&ctx, req, &resp);
  if (!s.ok()) return ToAbsl(s);
  if (resp.worker_id().empty()) return absl::InternalError("coordinator returned an empty worker id");
  bool drop_job = false;
  {
    absl::MutexLock lock(&mu_);
    if (!resp.keep_job() && !job_id_.empty()) {
      spdlog::warn("worker: coordinator did not keep job {}; dropping its state", job_id_);
      drop_job = true;
      job_id_.clear();
      queue_.clear();
    }
  }
  if (drop_job && engine_ != nullptr) engine_->Abort();
  if (resp.keep_job()) spdlog::info("worker: coordinator keeps us in job {}", resp.job_id());
  absl::MutexLock lock(&mu_);
  if (!worker_id_.empty() && worker_id_ != resp.worker_id()) {
    spdlog::warn("worker: coordinator assigned a new id {} (was {})", resp.worker_id(), worker_id_);
  }
  worker_id_ = resp.worker_id();
  credential_ = resp.worker_credential();
  registered_ = true;
  if (resp.heartbeat_interval_ms() > 0) heartbeat_ms_ = std::clamp<int64_t>(resp.heartbeat_interval_ms(), 50, 60000);
  spdlog::info("worker: registered as {} (name {}, data address {}, lease {} ms, heartbeat {} ms)", worker_id_,
               options_.name, req.data_address(), resp.lease_ms(), heartbeat_ms_);
  cv_.SignalAll();
  return absl::OkStatus();
}

grpc::Status WorkerDaemon::AttachOnce() {
  grpc::ClientContext ctx;
  PrepareContext(&ctx, milliseconds(0));
  v1::AttachRequest req;
  {
    absl::MutexLock lock(&mu_);
    req.set_worker_id(worker_id_);
    attach_ctx_ = &ctx;
    if (stopping_.load() || !registered_) ctx.TryCancel();
  }
  auto reader = stub_->Attach(&ctx, req);
  v1::WorkerCommand cmd;
  while (reader->Read(&cmd)) Dispatch(cmd);
  grpc::Status s = reader->Finish();
  absl::MutexLock lock(&mu_);
  attach_ctx_ = nullptr;
  registered_ = false;
  return s;
}

void WorkerDaemon::Dispatch(const v1::WorkerCommand& cmd) {
  switch (cmd.command_case()) {
    case v1::WorkerCommand::kPhase: {
      const v1::PhaseCommand& pc = cmd.phase();
      absl::MutexLock lock(&mu_);
      if (!pc.command_id().empty() && pc.command_id() == running_command_id_) {
        spdlog::info("worker: command {} is already running; ignoring the repeat", pc.command_id());
        return;
      }
      for (const auto& q : queue_) {
        if (!pc.command_id().empty() && q.command_id() == pc.command_id()) return;
      }
      if (queue_.size() >= kMaxQueuedCommands) {
        spdlog::error("worker: command queue full ({}); dropping command {}", queue_.size(), pc.command_id());
        return;
      }
      if (pc.phase() == v1::PHASE_SETUP && !running_command_id_.empty()) {
        // Runs once the phase in progress returns (an abort should end it).
        spdlog::warn("worker: command {} waits for command {}, still running", pc.command_id(), running_command_id_);
      }
      queue_.push_back(pc);
      cv_.SignalAll();
      return;
    }
    case v1::WorkerCommand::kAbortJob: {
      const std::string& job = cmd.abort_job();
      spdlog::warn("worker: coordinator aborts job {}", job);
      {
        absl::MutexLock lock(&mu_);
        queue_.erase(
            std::remove_if(queue_.begin(), queue_.end(), [&](const v1::PhaseCommand& c) { return c.job_id() == job; }),
            queue_.end());
        if (job_id_ == job) job_id_.clear();
      }
      if (engine_ != nullptr) engine_->Abort();
      return;
    }
    case v1::WorkerCommand::kDrain:
      spdlog::info("worker: draining (the coordinator assigns no new job to this worker)");
      return;
    case v1::WorkerCommand::kPing:
    case v1::WorkerCommand::COMMAND_NOT_SET:
      return;
  }
}

void WorkerDaemon::HeartbeatLoop() {
  int failures = 0;
  while (!stopping_.load()) {
    int64_t interval;
    bool preempt_expired = false;
    v1::HeartbeatRequest req;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_ms_;
      const absl::Time until = absl::Now() + absl::Milliseconds(interval);
      while (!stopping_.load() && absl::Now() < until && !(preempting_ && !preempt_announced_)) {
        cv_.WaitWithDeadline(&mu_, until);
      }
      if (stopping_.load()) return;
      preempt_expired = preempting_ && absl::Now() >= preempt_deadline_;
      if (!preempt_expired && !registered_) continue;
      req.set_worker_id(worker_id_);
      req.set_job_id(job_id_);
      req.set_generation(generation_);
      req.set_preempting(preempting_);
      if (preempting_) preempt_announced_ = true;
    }
    if (preempt_expired) {
      spdlog::warn(
          "worker: the coordinator did not release this worker within the preemption timeout; "
          "stopping (its job recovers without it)");
      RequestStop();
      return;
    }
    req.set_memory_bytes_in_use(ResidentMemoryBytes());
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, milliseconds(std::clamp<int64_t>(3 * interval, 1000, options_.rpc_timeout.count())));
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    if (s.ok()) {
      if (failures > 0) spdlog::info("worker: heartbeat ok again after {} failures", failures);
      failures = 0;
      if (resp.reregister()) CancelAttach("coordinator asked to re-register");
      if (req.preempting() && resp.release()) {
        spdlog::info("worker: released by the coordinator after preemption; stopping");
        RequestStop();
        return;
      }
    } else if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      CancelAttach("coordinator does not know this worker: " + s.error_message());
    } else if (++failures == 1 || failures % 30 == 0) {
      spdlog::warn("worker: heartbeat failed ({} in a row): {}", failures, s.error_message());
    }
  }
}

void WorkerDaemon::JobLoop() {
  while (true) {
    v1::PhaseCommand cmd;
    bool run = false;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !job_thread_exit_.load()) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      cmd = std::move(queue_.front());
      queue_.pop_front();
      run = !stopping_.load();
      if (run) {
        running_command_id_ = cmd.command_id();
        running_setup_ = cmd.phase() == v1::PHASE_SETUP;
      }
    }
    if (!run) {
      // Not started before the stop: report it failed without running it.
      v1::ReportPhaseRequest report;
      SealReport(worker_id(), cmd,
                 common::WithFailureKind(absl::UnavailableError("worker " + options_.name + " is shutting down"),
                                         v1::PHASE_FAILURE_KIND_FATAL),
                 0, &report);
      SendReport(report);
      continue;
    }
    RunCommand(cmd);
    absl::MutexLock lock(&mu_);
    running_command_id_.clear();
    running_setup_ = false;
    cv_.SignalAll();
  }
}

void WorkerDaemon::RunCommand(const v1::PhaseCommand& cmd) {
  v1::ReportPhaseRequest report;
  bool cached = false;
  {
    absl::MutexLock lock(&mu_);
    if (!cmd.command_id().empty() && cmd.command_id() == last_command_id_) {
      report = last_report_;
      cached = true;
    }
    if (cmd.phase() == v1::PHASE_SETUP || job_id_.empty()) {
      job_id_ = cmd.job_id();
    }
    generation_ = cmd.generation();
  }
  const std::string phase_name = v1::Phase_Name(cmd.phase());
  if (cached) {
    spdlog::info("worker: command {} ({} step {}) already done; sending its report again", cmd.command_id(), phase_name,
                 cmd.step());
  } else {
    spdlog::info("worker: job {} gen {} {} step {} (command {})", cmd.job_id(), cmd.generation(), phase_name,
                 cmd.step(), cmd.command_id());
    if (cmd.phase() == v1::PHASE_SETUP) LogMemoryEstimate(cmd);
    const auto t0 = Clock::now();
    absl::Status st = RunPhaseCatchingOutOfMemory(cmd, &report);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (report.peak_memory_bytes() <= 0) report.set_peak_memory_bytes(ResidentMemoryBytes());
    SealReport(worker_id(), cmd, st, seconds, &report);
    if (!st.ok()) spdlog::error("worker: {} step {} failed: {}", phase_name, cmd.step(), st.ToString());
    report.add_log_lines(fmt::format("{}: {} step {} {} in {:.3f} s", options_.name, phase_name, cmd.step(),
                                     st.ok() ? "done" : "FAILED", report.seconds()));
  }
  {
    absl::MutexLock lock(&mu_);
    last_command_id_ = cmd.command_id();
    last_report_ = report;
    if (cmd.phase() == v1::PHASE_TEARDOWN) job_id_.clear();
  }
  SendReport(report);
}

void WorkerDaemon::SendReport(const v1::ReportPhaseRequest& report) {
  Backoff backoff(options_.reconnect);
  auto give_up = Clock::now() + options_.report_retry_limit;
  bool stop_seen = false;
  int not_found = 0;
  while (true) {
    v1::ReportPhaseRequest req = report;
    req.set_worker_id(worker_id());  // may have changed on re-register
    v1::ReportPhaseResponse resp;
    grpc::ClientContext ctx;
    PrepareContext(&ctx, options_.rpc_timeout);
    grpc::Status s = stub_->ReportPhase(&ctx, req, &resp);
    if (s.ok()) return;
    const bool retry = IsTransient(s.error_code()) ||
                       (s.error_code() == grpc::StatusCode::NOT_FOUND && ++not_found <= kNotFoundRetries);
    if (!retry) {
      spdlog::error("worker: coordinator rejected the report of command {}: {} ({})", report.command_id(),
                    s.error_message(), static_cast<int>(s.error_code()));
      return;
    }
    // While stopping, keep trying only for a short, bounded time.
    if (stopping_.load() && !stop_seen) {
      stop_seen = true;
      give_up = std::min(give_up, Clock::now() + 2 * options_.rpc_timeout);
    }
    const auto delay = backoff.Next();
    if (Clock::now() + delay > give_up) {
      spdlog::error("worker: giving up on the report of command {}: {}", report.command_id(), s.error_message());
      return;
    }
    if (backoff.attempt() == 1 || backoff.attempt() % 10 == 0) {
      spdlog::warn("worker: report of command {} failed ({}); retrying", report.command_id(), s.error_message());
    }
    WaitForCoordinator(delay, /*stop_early=*/false);  // retries at once when the channel reconnects
  }
}

absl::Status WorkerDaemon::Run() {
  spdlog::info("worker: {} starting (device {}, coordinator {})", options_.name, options_.device, options_.coordinator);
  std::thread heartbeat([this] { HeartbeatLoop(); });
  std::thread job;
  absl::Status fatal;
  Backoff backoff(options_.reconnect);
  while (!stopping_.load()) {
    absl::Status st = Register();
    if (!st.ok()) {
      if (st.code() == absl::StatusCode::kUnauthenticated || st.code() == absl::StatusCode::kPermissionDenied ||
          st.code() == absl::StatusCode::kInvalidArgument) {
        spdlog::error("worker: registration rejected: {}", st.ToString());
        fatal = st;
        break;
      }
      const auto delay = backoff.Next();
      spdlog::warn("worker: cannot register with {} ({}); retrying in {} ms", options_.coordinator,
                   std::string(st.message()), delay.count());
      WaitForCoordinator(delay, /*stop_early=*/true);  // returns early once the coordinator is reachable
      continue;
    }
    if (engine_ == nullptr) {
      engine_ = engine_factory_(worker_id(), [this] {
        absl::MutexLock lock(&mu_);
        return credential_;
      });
      if (engine_ == nullptr) {
        fatal = absl::InternalError("the job engine could not be created");
        break;
      }
      job = std::thread([this] { JobLoop(); });
    }
    const auto attached_at = Clock::now();
    grpc::Status s = AttachOnce();
    if (stopping_.load()) break;
    if (Clock::now() - attached_at > std::chrono::seconds(5)) backoff.Reset();
    const auto delay = backoff.Next();
    spdlog::warn("worker: attach stream ended ({}: {}); reconnecting in {} ms", static_cast<int>(s.error_code()),
                 s.error_message(), delay.count());
    SleepUnlessStopping(delay);
  }
  stopping_.store(true);
  {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }
  // Let the phase in progress finish within the grace period, then abort it.
  {
    const absl::Time until = absl::Now() + absl::Milliseconds(options_.shutdown_grace.count());
    std::string still_running;
    {
      absl::MutexLock lock(&mu_);
      while (!running_command_id_.empty() && absl::Now() < until) cv_.WaitWithDeadline(&mu_, until);
      still_running = running_command_id_;
    }
    if (!still_running.empty() && engine_ != nullptr) {
      spdlog::warn("worker: phase {} still running after {} ms; aborting it", still_running,
                   options_.shutdown_grace.count());
      engine_->Abort();
    }
  }
  job_thread_exit_.store(true);
  {
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
  }
  if (job.joinable()) job.join();
  heartbeat.join();
  spdlog::info("worker: {} stopped", options_.name);
  return fatal;
}

}  // namespace tandem::worker
