// Job files: YAML -> tandem.v1.JobSpec, defaults and validation. Shared by
// tandemctl (client-side validation before anything starts) and the
// coordinator (re-validates every SubmitJob). docs/job-spec.md documents
// every key; the defaults live in DefaultJobSpec() only.
//
// Errors are INVALID_ARGUMENT (NOT_FOUND for a missing file) whose message
// starts with the key's path: "train.steps: must be >= 1, got 0".
// Thread-compatible: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"

namespace tandem::common {

// Size limit of a job file.
inline constexpr size_t kMaxJobFileBytes = 4 << 20;

// Reads a job file, applies overrides ("train.steps=10", as --set) to the
// YAML tree, converts, fills defaults and validates.
absl::StatusOr<tandem::v1::JobSpec> LoadJobSpecFile(
    const std::string& path, const std::vector<std::string>& overrides = {});
absl::StatusOr<tandem::v1::JobSpec> ParseJobSpecYaml(
    const std::string& text, const std::vector<std::string>& overrides = {});

// Every default in one place (the value a key takes when the file omits it).
tandem::v1::JobSpec DefaultJobSpec();

// For specs that arrive over the API: fills every field whose zero value is
// not a legal setting (steps, lr, batch sizes, ...) from DefaultJobSpec(),
// and the derived defaults (num_key_value_heads = num_attention_heads,
// init.sft.lr = train.lr, cluster.min_workers = cluster.workers, ...).
// Fields where zero is legal (rl.kl_coef, train.weight_decay, ...) keep it.
void ApplyJobDefaults(tandem::v1::JobSpec* spec);

// Ranges, allowed values and cross-field rules (heads divide hidden size,
// global_batch divisible by micro_batch * workers, ...). Call after
// ApplyJobDefaults.
absl::Status ValidateJobSpec(const tandem::v1::JobSpec& spec);

// Converts a spec back to YAML (normalized, every key), e.g. for
// `tandemctl validate` and for logs.
std::string JobSpecToYaml(const tandem::v1::JobSpec& spec);

// Name of a Phase for metrics and messages ("rollout", "sft_step", ...).
std::string KindName(tandem::v1::JobKind kind);
std::string DeviceName(tandem::v1::DeviceKind device);

}  // namespace tandem::common
