// Fuzz target: a job file, through what `tandemctl validate` and the
// coordinator's SubmitJob run on it (common/job_spec.h): YAML -> JobSpec
// with --set overrides, defaults, validation; then the normalized YAML that
// `validate` prints, and the job's phase plan. Input: the file's text, then
// optionally NUL-separated overrides ("train.steps=3"). A job that
// validates must print as YAML that loads back to the same spec.
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "server/jobs/phase_plan.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  std::vector<std::string> parts = absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\0');
  const std::string text = parts.front();
  std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  if (overrides.size() > 8) return 0;  // as many as anyone types; keeps inputs focused

  auto spec = common::ParseJobSpecYaml(text, overrides);
  if (!spec.ok()) return 0;
  if (absl::Status st = common::ValidateJobSpec(*spec); !st.ok()) {
    fuzz::Fail("a loaded job fails ValidateJobSpec: " + st.ToString());
  }
  const std::string yaml = common::JobSpecToYaml(*spec);
  auto again = common::ParseJobSpecYaml(yaml);
  if (!again.ok()) {
    fuzz::Fail("the normalized job does not load again: " + again.status().ToString() + "\n" + yaml);
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) {
    fuzz::Fail("the job changes in the round trip through YAML:\n" + spec->DebugString() + "\n" + again->DebugString());
  }
  // SubmitJob: what the coordinator derives from the spec.
  const server::PhasePlan plan(*spec);
  server::PhaseCursor cursor;
  for (int i = 0; i < 64; ++i) {
    if (!plan.At(cursor)) break;
    cursor = plan.Next(cursor);
  }
  (void)plan.UnitOfStep(spec->train().steps());
  return 0;
}
