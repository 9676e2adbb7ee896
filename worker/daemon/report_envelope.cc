#include "worker/daemon/report_envelope.h"

#include <utility>

#include "common/phase_failure.h"

namespace tandem::worker {

std::string TruncateText(std::string s, size_t n) {
  if (s.size() > n) {
    s.resize(n);
    s += "...";
  }
  return s;
}

void SealReport(const std::string& worker_id, const tandem::v1::PhaseCommand& cmd, const absl::Status& outcome,
                double seconds, tandem::v1::ReportPhaseRequest* report) {
  report->set_worker_id(worker_id);
  report->set_command_id(cmd.command_id());
  report->set_job_id(cmd.job_id());
  report->set_generation(cmd.generation());
  report->set_phase(cmd.phase());
  report->set_step(cmd.step());
  report->set_seconds(seconds);
  report->set_ok(outcome.ok());
  if (outcome.ok()) {
    report->clear_error();
    report->clear_failure();
    report->set_retryable(false);
  } else {
    report->set_error(TruncateText(std::string(outcome.message()), kMaxReportErrorChars));
    *report->mutable_failure() = common::ToPhaseFailure(outcome, kMaxReportErrorChars);
    report->set_retryable(report->failure().kind() == tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
  }
  auto* lines = report->mutable_log_lines();
  if (static_cast<size_t>(lines->size()) > kMaxReportLogLines) {
    lines->DeleteSubrange(0, lines->size() - static_cast<int>(kMaxReportLogLines));
  }
  for (auto& line : *lines) line = TruncateText(std::move(line), kMaxReportLineChars);
}

}  // namespace tandem::worker
