#include "server/cli/job_file.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/job_spec.h"
#include "worker/model/job_model.h"

namespace tandem::cli {

absl::StatusOr<tandem::v1::JobSpec> LoadJobForCli(const std::string& path, const ParsedArgs& args) {
  std::vector<std::string> overrides = args.GetAll("set");
  if (args.Has("workers")) {
    ASSIGN_OR_RETURN(auto n, ParseInt("--workers", args.Get("workers"), 1, 4096));
    overrides.push_back(absl::StrCat("cluster.workers=", n));
  }
  ASSIGN_OR_RETURN(auto spec, common::LoadJobSpecFile(path, overrides));
  if (args.Has("workers")) {
    // min_workers defaults from workers; keep it consistent with the override.
    if (spec.cluster().min_workers() > spec.cluster().workers()) {
      spec.mutable_cluster()->set_min_workers(spec.cluster().workers());
    }
  }
  if (args.Has("resume-from")) spec.set_resume_from(args.Get("resume-from"));
  RETURN_IF_ERROR(common::ValidateJobSpec(spec));
  RETURN_IF_ERROR(model::CheckJobForWorkers(spec));
  return spec;
}

}  // namespace tandem::cli
