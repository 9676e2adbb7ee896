#include "server/cli/job_file.h"

#include "worker/model/job_model.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace tandem::cli {

absl::StatusOr<tandem::v1::JobSpec> LoadJobForCli(const std::string& path, const ParsedArgs& args) {
  std::vector<std::string> overrides = args.GetAll("set");
  if (args.Has("workers")) {
    auto n = ParseInt("--workers", args.Get("workers"), 1, 4096);
    if (!n.ok()) return n.status();
    overrides.push_back(absl::StrCat("cluster.workers=", *n));
  }
  auto spec = common::LoadJobSpecFile(path, overrides);
  if (!spec.ok()) return spec.status();
  if (args.Has("workers")) {
    // min_workers defaults from workers; keep it consistent with the override.
    if (spec->cluster().min_workers() > spec->cluster().workers()) {
      spec->mutable_cluster()->set_min_workers(spec->cluster().workers());
    }
  }
  if (args.Has("resume-from")) spec->set_resume_from(args.Get("resume-from"));
  if (absl::Status st = common::ValidateJobSpec(*spec); !st.ok()) return st;
  if (absl::Status st = model::CheckJobForWorkers(*spec); !st.ok()) return st;
  return spec;
}

}  // namespace tandem::cli
