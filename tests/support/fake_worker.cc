// A worker against the Cluster service, in-process (see fake_worker.h).
#include "tests/support/fake_worker.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/auth.h"

namespace tandem::test_support {

using tandem::v1::Cluster;

std::unique_ptr<grpc::ClientContext> AuthContext(const std::string& token, int ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  common::AddBearerToken(ctx.get(), token);
  return ctx;
}

FakeWorker::FakeWorker(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Run(); });
  heartbeat_ = std::thread([this] { Heartbeats(); });
}

FakeWorker::~FakeWorker() { Stop(); }

void FakeWorker::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string FakeWorker::id() {
  absl::MutexLock l(&mu_);
  return id_;
}

std::vector<std::string> FakeWorker::phases() {
  absl::MutexLock l(&mu_);
  return phases_;
}

tandem::v1::Assignment FakeWorker::last_assignment() {
  absl::MutexLock l(&mu_);
  return assignment_;
}

std::string FakeWorker::credential() {
  absl::MutexLock l(&mu_);
  return credential_;
}

std::unique_ptr<grpc::ClientContext> FakeWorker::WorkerContext(int ms) {
  auto ctx = AuthContext(options_.token, ms);
  common::AddWorkerCredential(ctx.get(), credential());
  return ctx;
}

std::unique_ptr<Cluster::Stub> FakeWorker::Stub() {
  return Cluster::NewStub(grpc::CreateChannel(options_.address(), grpc::InsecureChannelCredentials()));
}

void FakeWorker::Run() {
  while (!stop_) {
    auto stub = Stub();
    tandem::v1::RegisterWorkerRequest req;
    req.set_name(options_.name);
    req.set_host("localhost");
    req.set_device(tandem::v1::DEVICE_KIND_CPU);
    req.set_device_count(1);
    {
      absl::MutexLock l(&mu_);
      req.set_worker_id(id_);
      req.set_worker_credential(credential_);
      req.set_job_id(job_);
      req.set_generation(generation_);
    }
    tandem::v1::RegisterWorkerResponse resp;
    if (!stub->RegisterWorker(AuthContext(options_.token).get(), req, &resp).ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    {
      absl::MutexLock l(&mu_);
      id_ = resp.worker_id();
      credential_ = resp.worker_credential();
      if (!resp.keep_job()) {
        job_.clear();
        cache_.clear();
      }
    }
    grpc::ClientContext ctx;
    common::AddBearerToken(&ctx, options_.token);
    common::AddWorkerCredential(&ctx, credential());
    tandem::v1::AttachRequest attach;
    attach.set_worker_id(resp.worker_id());
    auto reader = stub->Attach(&ctx, attach);
    std::atomic<bool> stream_done{false};
    std::thread canceller([&] {
      while (!stop_ && !stream_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ctx.TryCancel();
    });
    tandem::v1::WorkerCommand cmd;
    while (!stop_ && reader->Read(&cmd)) {
      if (cmd.has_phase()) Handle(stub.get(), cmd.phase());
      if (cmd.has_abort_job()) {
        absl::MutexLock l(&mu_);
        job_.clear();
      }
    }
    stream_done = true;
    canceller.join();
    reader->Finish().ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void FakeWorker::Handle(Cluster::Stub* stub, const tandem::v1::PhaseCommand& cmd) {
  tandem::v1::ReportPhaseRequest report;
  if (options_.cache_reports) {
    absl::MutexLock l(&mu_);
    auto cached = cache_.find(cmd.command_id());
    if (cached != cache_.end()) {
      report = cached->second;
      replayed_++;
    }
  }
  if (report.command_id().empty()) {
    if (stall && stall(cmd)) return;
    {
      absl::MutexLock l(&mu_);
      phases_.push_back(absl::StrCat(tandem::v1::Phase_Name(cmd.phase()), "(", cmd.step(), ")"));
      if (cmd.phase() == tandem::v1::PHASE_SETUP) {
        job_ = cmd.job_id();
        generation_ = cmd.generation();
        assignment_ = cmd.assignment();
      }
    }
    report.set_worker_id(id());
    report.set_command_id(cmd.command_id());
    report.set_job_id(cmd.job_id());
    report.set_generation(cmd.generation());
    report.set_phase(cmd.phase());
    report.set_step(cmd.step());
    report.set_seconds(0.001);
    report.set_peak_memory_bytes(1000 + cmd.step());
    report.mutable_metrics()->set_loss(cmd.step() > 0 ? 1.0 / cmd.step() : 0);
    report.add_log_lines(absl::StrCat(options_.name, " ran ", tandem::v1::Phase_Name(cmd.phase())));
    tandem::v1::PhaseFailure failure;
    report.set_ok(!(fail && fail(cmd, &failure)));
    if (!report.ok()) {
      report.set_error(failure.message());
      *report.mutable_failure() = std::move(failure);
    }
    if (options_.fill) options_.fill(*this, cmd, &report);
    if (options_.cache_reports) {
      absl::MutexLock l(&mu_);
      cache_[cmd.command_id()] = report;
    }
  }
  tandem::v1::ReportPhaseResponse resp;
  for (int attempt = 0; attempt < 50 && !stop_; ++attempt) {
    auto st = stub->ReportPhase(WorkerContext().get(), report, &resp);
    if (st.ok() || st.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void FakeWorker::Heartbeats() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!heartbeats_on || id().empty()) continue;
    tandem::v1::HeartbeatRequest hb;
    hb.set_worker_id(id());
    hb.set_preempting(preempting.load());
    tandem::v1::HeartbeatResponse resp;
    if (Stub()->Heartbeat(WorkerContext(1000).get(), hb, &resp).ok() && resp.release()) {
      released = true;
    }
  }
}

}  // namespace tandem::test_support
