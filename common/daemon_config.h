// Daemon configuration: YAML file (configs/coordinator.yaml,
// configs/worker.yaml) -> tandem.v1.CoordinatorConfig / WorkerDaemonConfig,
// then command-line flags on top (a flag is an override of one key), then
// defaults and validation. Unknown keys are rejected with their path.
// Every knob is declared once, in its daemon's table (daemon_config_table.cc:
// default, range, help, flag); the flags, --help, the defaults and
// docs/operations.md come from it. Thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/config.pb.h"

namespace tandem::common {

struct ConfigTable;
const ConfigTable& CoordinatorConfigTable();
const ConfigTable& WorkerConfigTable();

// One command-line flag bound to a config key ("lease-ms" -> "lease_ms"),
// made from a table row that names a flag.
struct DaemonFlag {
  std::string flag;  // without the leading "--"
  std::string path;  // config key path
  std::string help;
  // A switch: "--flag" alone means true ("--flag=false" still works).
  bool boolean = false;
};

struct DaemonArgs {
  std::string config_file;             // --config
  std::vector<std::string> overrides;  // "path=value" from flags
  std::vector<std::string> positional;
  bool help = false;
};

const std::vector<DaemonFlag>& CoordinatorFlags();
const std::vector<DaemonFlag>& WorkerFlags();

// Parses --config FILE, the table's flags (--flag=value or --flag value),
// --set key.path=value (any config key) and --help/-h. Unknown flags are
// INVALID_ARGUMENT naming the flag.
absl::StatusOr<DaemonArgs> ParseDaemonArgs(int argc, const char* const* argv, const std::vector<DaemonFlag>& flags);
std::string DaemonUsage(const std::string& program, const std::string& summary, const std::vector<DaemonFlag>& flags);

// file "" = defaults only. Overrides are applied after the file.
absl::StatusOr<tandem::v1::CoordinatorConfig> LoadCoordinatorConfig(const std::string& file,
                                                                    const std::vector<std::string>& overrides = {});
absl::StatusOr<tandem::v1::WorkerDaemonConfig> LoadWorkerConfig(const std::string& file,
                                                                const std::vector<std::string>& overrides = {});

tandem::v1::CoordinatorConfig DefaultCoordinatorConfig();
tandem::v1::WorkerDaemonConfig DefaultWorkerConfig();

// The effective config as YAML, for the start-up log (holds file paths,
// never token values).
std::string CoordinatorConfigToYaml(const tandem::v1::CoordinatorConfig& config);
std::string WorkerConfigToYaml(const tandem::v1::WorkerDaemonConfig& config);

}  // namespace tandem::common
