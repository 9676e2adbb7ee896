// In-process command-line tools (no daemon):
//   tandemctl model init --config MODEL.yaml|config.json --seed S --out DIR
//   tandemctl generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)
//       [--max-new-tokens N] [--greedy | --temperature T --top-p P --top-k K]
//       [--seed S] [--num-samples N] [--threads N] [--output text|json]
// `args` are the words after the command name ("model init" / "generate").
// Return the process exit code: 0 ok, 1 runtime error, 2 usage error.
// Messages go to stderr, results to stdout.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"

namespace tandem::model {

int ModelInitCommand(const std::vector<std::string>& args);
int GenerateCommand(const std::vector<std::string>& args);

// Reads a model config and validates it: JSON (a Hugging Face config.json),
// or YAML (.yaml/.yml): the keys of a job file's model.config, read by the
// job file's reader (common/job_spec.h) and checked by the same rules.
absl::StatusOr<ModelConfig> LoadModelConfigFile(const std::string& path);

}  // namespace tandem::model
