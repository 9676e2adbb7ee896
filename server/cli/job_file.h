// Loading a job file for submit / validate / run --local: the same code the
// coordinator uses (common/job_spec.h), plus the CLI's own overrides
// (--workers N, --resume-from PATH), re-validated afterwards.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/cli/cli_args.h"
#include "tandem/v1/job.pb.h"

namespace tandem::cli {

absl::StatusOr<tandem::v1::JobSpec> LoadJobForCli(const std::string& path, const ParsedArgs& args);

}  // namespace tandem::cli
