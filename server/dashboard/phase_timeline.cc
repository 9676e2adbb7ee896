#include "server/dashboard/phase_timeline.h"

#include <algorithm>

namespace tandem::server {
namespace {

constexpr size_t kMaxWorkersWithMemory = 4096;

}  // namespace

PhaseTimeline::PhaseTimeline(const Clock* clock, size_t spans_per_job, size_t max_jobs)
    : clock_(clock), spans_per_job_(std::max<size_t>(1, spans_per_job)), max_jobs_(std::max<size_t>(1, max_jobs)) {}

PhaseTimeline::JobSpans* PhaseTimeline::JobLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    if (jobs_.size() >= max_jobs_) {
      auto oldest = std::min_element(jobs_.begin(), jobs_.end(),
                                     [](const auto& a, const auto& b) { return a.second.touched < b.second.touched; });
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(job_id, JobSpans{}).first;
  }
  it->second.touched = ++tick_;
  return &it->second;
}

void PhaseTimeline::Push(JobSpans* job, PhaseSpan span) {
  job->spans.push_back(std::move(span));
  while (job->spans.size() > spans_per_job_) job->spans.pop_front();
}

void PhaseTimeline::CommandSent(const std::string& worker_id, const tandem::v1::WorkerCommand& command) {
  const std::string& job_id = command.has_phase() ? command.phase().job_id() : command.abort_job();
  if (job_id.empty()) return;  // ping, drain
  const double now = clock_->WallSeconds();
  absl::MutexLock lock(&mu_);
  JobSpans* job = JobLocked(job_id);
  // The same command sent again (after a re-attach) keeps its one span.
  if (command.has_phase()) {
    for (auto it = job->spans.rbegin(); it != job->spans.rend(); ++it) {
      if (it->worker_id == worker_id && it->command_id == command.phase().command_id()) return;
    }
  }
  // A worker runs one phase at a time: its open span ends here. An abort
  // ends the generation: every open span of the job ends (a lost worker's
  // too, which no command reaches any more).
  for (auto& s : job->spans) {
    if ((s.worker_id == worker_id || !command.has_phase()) && s.end == 0) {
      s.end = now;
      s.ok = false;
    }
  }
  if (!command.has_phase()) return;
  const auto& p = command.phase();
  Push(job, PhaseSpan{worker_id, p.command_id(), p.phase(), p.step(), p.generation(), now, 0, true, 0});
}

void PhaseTimeline::ReportReceived(const tandem::v1::ReportPhaseRequest& report) {
  const double now = clock_->WallSeconds();
  const double from = now - std::max(0.0, report.seconds());
  absl::MutexLock lock(&mu_);
  JobSpans* job = JobLocked(report.job_id());
  for (auto it = job->spans.rbegin(); it != job->spans.rend(); ++it) {
    if (it->worker_id != report.worker_id() || it->command_id != report.command_id()) continue;
    if (it->end != 0) return;  // a duplicate report (the command was re-sent)
    it->start = std::max(it->start, from);
    it->end = now;
    it->ok = report.ok();
    it->peak_memory_bytes = report.peak_memory_bytes();
    return;
  }
  // Sent before this coordinator started (or dropped from the buffer).
  Push(job, PhaseSpan{report.worker_id(), report.command_id(), report.phase(), report.step(), report.generation(), from,
                      now, report.ok(), report.peak_memory_bytes()});
}

void PhaseTimeline::MemoryReported(const std::string& worker_id, int64_t bytes_in_use) {
  absl::MutexLock lock(&mu_);
  if (memory_.size() >= kMaxWorkersWithMemory && !memory_.count(worker_id)) memory_.erase(memory_.begin());
  memory_[worker_id] = bytes_in_use;
}

std::vector<PhaseSpan> PhaseTimeline::Spans(const std::string& job_id, double since) const {
  absl::MutexLock lock(&mu_);
  std::vector<PhaseSpan> out;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return out;
  for (const auto& s : it->second.spans) {
    if (s.end == 0 || s.end >= since) out.push_back(s);
  }
  return out;
}

std::optional<int64_t> PhaseTimeline::MemoryInUse(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = memory_.find(worker_id);
  if (it == memory_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tandem::server
