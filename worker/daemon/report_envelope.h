// The report envelope: what every ReportPhase carries besides the phase's
// own result (which the engine fills: metrics, values, the typed setup or
// checkpoint result, published checkpoints, log lines). The worker daemon
// seals each report once: who sends it, the command it answers, the outcome
// with its typed failure (common/phase_failure.h), the wall time, and the
// bounds on what goes over the wire. Pure function.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::worker {

inline constexpr size_t kMaxReportLogLines = 256;  // the newest are kept
inline constexpr size_t kMaxReportLineChars = 4096;
inline constexpr size_t kMaxReportErrorChars = 16384;

// `s` cut to n characters, with "..." when cut.
std::string TruncateText(std::string s, size_t n);

void SealReport(const std::string& worker_id, const tandem::v1::PhaseCommand& cmd, const absl::Status& outcome,
                double seconds, tandem::v1::ReportPhaseRequest* report);

}  // namespace tandem::worker
