// Fuzz target: a daemon config file (common/daemon_config.h), as
// tandem-coordinator and tandem-worker read it at start: YAML ->
// CoordinatorConfig / WorkerDaemonConfig with overrides ("lease_ms=500",
// what the command-line flags become), defaults and validation. Input: the
// file's text, then optionally NUL-separated overrides; it is loaded as
// both daemons' config. A config that loads must print (the start-up log's
// YAML) as a file that loads back to the same config.
#include <google/protobuf/util/message_differencer.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/daemon_config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

template <typename Config, typename Load, typename ToYaml>
void RoundTrip(const absl::StatusOr<Config>& config, Load load, ToYaml to_yaml, const std::string& path) {
  if (!config.ok()) return;
  const std::string yaml = to_yaml(*config);
  tandem::fuzz::WriteFileOrDie(path, yaml);
  auto again = load(path, std::vector<std::string>{});
  if (!again.ok()) {
    tandem::fuzz::Fail("the printed config does not load again: " + again.status().ToString() + "\n" + yaml);
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(*config, *again)) {
    tandem::fuzz::Fail("the config changes in the round trip through YAML:\n" + config->DebugString() + "\n" +
                       again->DebugString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  std::vector<std::string> parts = absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\0');
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  if (overrides.size() > 8) return 0;  // as many flags as anyone types; keeps inputs focused
  const std::string& dir = fuzz::ScratchDir("daemon_config");
  const std::string file = dir + "/config.yaml";
  fuzz::WriteFileOrDie(file, parts.front());
  RoundTrip(common::LoadCoordinatorConfig(file, overrides), common::LoadCoordinatorConfig,
            common::CoordinatorConfigToYaml, dir + "/coordinator-printed.yaml");
  RoundTrip(common::LoadWorkerConfig(file, overrides), common::LoadWorkerConfig, common::WorkerConfigToYaml,
            dir + "/worker-printed.yaml");
  return 0;
}
