// Job files: YAML -> tandem.v1.JobSpec, defaults and validation. Shared by
// tandemctl (client-side validation before anything starts) and the
// coordinator (re-validates every SubmitJob) and the worker (applies the
// defaults to the spec it runs). Every key's default, range and help live in
// one table, JobSpecTable() (job_spec_table.cc); docs/job-spec.md shows it.
// The inline model config is checked by the model's own rules
// (model::ModelConfigFromJob, worker/model/job_model.h).
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

struct ConfigTable;

// Size limit of a job file.
inline constexpr size_t kMaxJobFileBytes = 4 << 20;

// Reads a job file, applies overrides ("train.steps=10", as --set) to the
// YAML tree, converts, fills defaults and validates.
absl::StatusOr<tandem::v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                                    const std::vector<std::string>& overrides = {});
absl::StatusOr<tandem::v1::JobSpec> ParseJobSpecYaml(const std::string& text,
                                                     const std::vector<std::string>& overrides = {});

// The job spec's table: every key with its default, range and help.
const ConfigTable& JobSpecTable();

// The table's literal defaults (the values keys take when a file omits them).
tandem::v1::JobSpec DefaultJobSpec();

// For specs that arrive over the API (and on the worker, for the spec it
// runs): fills every zero field from the table's defaults, then the derived
// defaults (num_key_value_heads = num_attention_heads, init.sft.lr =
// train.lr, cluster.min_workers = cluster.workers, task.name, ...). Keys
// whose zero is a legal setting (rl.kl_coef, train.grad_clip, ...) keep it.
// Idempotent.
void ApplyJobDefaults(tandem::v1::JobSpec* spec);

// Ranges, allowed values and cross-field rules (heads divide hidden size,
// global_batch divisible by micro_batch * workers, ...). Call after
// ApplyJobDefaults.
absl::Status ValidateJobSpec(const tandem::v1::JobSpec& spec);

// Every key in its range (the table's rules only, no cross-field rules): what
// a worker checks of the spec it runs. Call after ApplyJobDefaults.
absl::Status CheckJobSpecKeys(const tandem::v1::JobSpec& spec);

// Converts a spec back to YAML (normalized, every key), e.g. for
// `tandemctl validate` and for logs.
std::string JobSpecToYaml(const tandem::v1::JobSpec& spec);

// Name of a Phase for metrics and messages ("rollout", "sft_step", ...).
std::string KindName(tandem::v1::JobKind kind);
std::string DeviceName(tandem::v1::DeviceKind device);

}  // namespace tandem::common
