#include "server/cli/job_follow.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include "server/cli/format.h"

namespace tandem::cli {
namespace v1 = tandem::v1;

void Canceller::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

bool Canceller::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void Canceller::Track(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  ctx_ = ctx;
  if (cancelled_ && ctx != nullptr) ctx->TryCancel();
}

namespace {

bool Transient(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         s.error_code() == grpc::StatusCode::INTERNAL || s.error_code() == grpc::StatusCode::UNKNOWN;
}

// Sleeps d in small slices; false when cancelled.
bool Pause(std::chrono::milliseconds d, Canceller* cancel) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
    if (cancel != nullptr && cancel->cancelled()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cancel == nullptr || !cancel->cancelled();
}

}  // namespace

grpc::Status FollowJob(ControlClient& client, const std::string& job_id, bool from_start, const JobEventFn& on_event,
                       Canceller* cancel, v1::Job* final_job, std::chrono::seconds unreachable_limit) {
  auto last_contact = std::chrono::steady_clock::now();
  std::chrono::milliseconds delay(250);
  bool first = true;
  while (true) {
    if (cancel != nullptr && cancel->cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "interrupted");
    v1::Job job;
    {
      grpc::ClientContext ctx;
      client.Prepare(&ctx);
      if (cancel != nullptr) cancel->Track(&ctx);
      v1::GetJobRequest req;
      req.set_job_id(job_id);
      grpc::Status s = client.stub().GetJob(&ctx, req, &job);
      if (cancel != nullptr) cancel->Track(nullptr);
      if (!s.ok()) {
        if (cancel != nullptr && cancel->cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "interrupted");
        if (!Transient(s) || std::chrono::steady_clock::now() - last_contact > unreachable_limit) return s;
        if (!Pause(delay, cancel)) continue;
        delay = std::min(delay * 2, std::chrono::milliseconds(5000));
        continue;
      }
    }
    last_contact = std::chrono::steady_clock::now();
    delay = std::chrono::milliseconds(250);
    if (IsTerminal(job.state())) {
      *final_job = job;
      return grpc::Status::OK;
    }
    grpc::ClientContext ctx;
    client.Prepare(&ctx, std::chrono::milliseconds(0));
    if (cancel != nullptr) cancel->Track(&ctx);
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_from_start(first && from_start);
    first = false;
    auto reader = client.stub().WatchJob(&ctx, req);
    v1::JobEvent ev;
    bool ended = false;
    while (reader->Read(&ev)) {
      last_contact = std::chrono::steady_clock::now();
      if (ev.state() != v1::JOB_STATE_UNSPECIFIED) job.set_state(ev.state());
      if (ev.kind() == "step" && ev.has_metrics()) {
        *job.mutable_latest() = ev.metrics();
        if (ev.metrics().step() > job.step()) job.set_step(ev.metrics().step());
      }
      if (job.started_at() == 0 && job.state() == v1::JOB_STATE_RUNNING) job.set_started_at(NowUnix());
      if (on_event) on_event(job, ev);
      if (IsTerminal(job.state())) {
        ended = true;
        ctx.TryCancel();
        break;
      }
    }
    grpc::Status s = reader->Finish();
    if (cancel != nullptr) cancel->Track(nullptr);
    if (cancel != nullptr && cancel->cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "interrupted");
    if (!ended && !s.ok() && !Transient(s) && s.error_code() != grpc::StatusCode::CANCELLED) return s;
    if (!ended) Pause(std::chrono::milliseconds(500), cancel);  // then GetJob again
  }
}

ProgressPrinter::ProgressPrinter(double min_interval_s)
    : tty_(isatty(STDOUT_FILENO) == 1), min_interval_s_(min_interval_s) {}

void ProgressPrinter::Step(const v1::Job& job, const v1::StepMetrics& m) {
  const double now = NowUnix();
  const std::string line = ProgressLine(job, m, now);
  const bool last = job.total_steps() > 0 && m.step() >= job.total_steps();
  absl::MutexLock lock(&mu_);
  if (tty_) {
    std::cout << "\r\033[K" << line << std::flush;
    line_open_ = true;
    return;
  }
  if (last || now - last_print_ >= min_interval_s_) {
    std::cout << line << "\n" << std::flush;
    last_print_ = now;
    pending_.clear();
  } else {
    pending_ = line;
  }
}

void ProgressPrinter::Message(const std::string& text) {
  absl::MutexLock lock(&mu_);
  if (line_open_) std::cout << "\n";
  line_open_ = false;
  if (!pending_.empty()) std::cout << pending_ << "\n";
  pending_.clear();
  std::cout << text << "\n" << std::flush;
}

void ProgressPrinter::Finish() {
  absl::MutexLock lock(&mu_);
  if (line_open_) std::cout << "\n";
  if (!pending_.empty()) std::cout << pending_ << "\n";
  pending_.clear();
  line_open_ = false;
  std::cout << std::flush;
}

}  // namespace tandem::cli
