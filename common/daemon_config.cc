#include "common/daemon_config.h"

#include <algorithm>

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/bandwidth.h"
#include "common/config_table.h"
#include "common/status_util.h"
#include "common/yaml_proto.h"

namespace tandem::common {
namespace {

using tandem::v1::CoordinatorConfig;
using tandem::v1::WorkerDaemonConfig;

constexpr size_t kMaxConfigBytes = 1 << 20;

bool ValidListen(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  int port = -1;
  return absl::SimpleAtoi(s.substr(colon + 1), &port) && port >= 0 && port < 65536;
}

// 127.0.0.0/8, ::1 and localhost: only this machine can connect.
bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

template <typename Config>
absl::StatusOr<Config> LoadConfig(const std::string& file, const std::vector<std::string>& overrides, Config config,
                                  const YamlProtoOptions& options) {
  YAML::Node root(YAML::NodeType::Map);
  std::string what = "config";
  if (!file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadTextFile(file, kMaxConfigBytes));
    ASSIGN_OR_RETURN(root, ParseYaml(text, file, kMaxConfigBytes));
    what = file;
  }
  for (const auto& o : overrides) RETURN_IF_ERROR(ApplyYamlOverride(root, o));
  absl::Status s = YamlToProto(root, &config, options);
  if (s.ok()) s = CheckProtoRules(config, options);
  if (!s.ok()) return Annotate(s, what);
  return config;
}

// The table's keys that have a flag, with their help, allowed values and
// default.
std::vector<DaemonFlag> FlagsOf(const ConfigTable& table) {
  std::vector<DaemonFlag> flags;
  for (const ConfigKey& key : table.keys()) {
    if (key.flag.empty()) continue;
    DaemonFlag f;
    f.flag = std::string(key.flag);
    f.path = std::string(key.path);
    f.help = std::string(key.help);
    if (std::string allowed = AllowedText(table, key); !allowed.empty()) absl::StrAppend(&f.help, " (", allowed, ")");
    std::string def = DefaultText(table, key);
    def.erase(std::remove(def.begin(), def.end(), '`'), def.end());
    if (def != "\"\"" && def != "false") absl::StrAppend(&f.help, " [", def, "]");
    f.boolean = FindFieldByPath(table.message, key.path)->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL;
    flags.push_back(std::move(f));
  }
  return flags;
}

}  // namespace

const std::vector<DaemonFlag>& CoordinatorFlags() {
  static const auto* flags = new std::vector<DaemonFlag>(FlagsOf(CoordinatorConfigTable()));
  return *flags;
}

const std::vector<DaemonFlag>& WorkerFlags() {
  static const auto* flags = new std::vector<DaemonFlag>(FlagsOf(WorkerConfigTable()));
  return *flags;
}

absl::StatusOr<DaemonArgs> ParseDaemonArgs(int argc, const char* const* argv, const std::vector<DaemonFlag>& flags) {
  DaemonArgs args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      args.help = true;
      continue;
    }
    if (!absl::StartsWith(a, "--")) {
      args.positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto take_value = [&]() -> absl::Status {
      if (has_value) return absl::OkStatus();
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      value = argv[++i];
      return absl::OkStatus();
    };
    if (name == "config") {
      RETURN_IF_ERROR(take_value());
      args.config_file = value;
      continue;
    }
    if (name == "set") {
      RETURN_IF_ERROR(take_value());
      args.overrides.push_back(value);
      continue;
    }
    const DaemonFlag* flag = nullptr;
    for (const auto& f : flags) {
      if (f.flag == name) flag = &f;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (flag->boolean && !has_value) {
      value = "true";
    } else {
      RETURN_IF_ERROR(take_value());
    }
    // Quote so that YAML reads the value as a plain string where it could be
    // mistaken for something else (e.g. an empty string).
    if (value.empty()) value = "\"\"";
    args.overrides.push_back(absl::StrCat(flag->path, "=", value));
  }
  return args;
}

std::string DaemonUsage(const std::string& program, const std::string& summary, const std::vector<DaemonFlag>& flags) {
  std::string out = absl::StrCat("Usage: ", program, " [--config FILE] [flags]\n", summary, "\n\nFlags:\n");
  absl::StrAppend(&out, "  --config FILE                 YAML config; flags override its keys\n");
  absl::StrAppend(&out, "  --set key.path=value          override any config key\n");
  for (const auto& f : flags) {
    std::string left = absl::StrCat("  --", f.flag, f.boolean ? "" : " VALUE");
    if (left.size() < 32) left.resize(32, ' ');
    absl::StrAppend(&out, left, f.help, "\n");
  }
  absl::StrAppend(&out, "  --help                        this text\n");
  return out;
}

CoordinatorConfig DefaultCoordinatorConfig() {
  CoordinatorConfig c;
  SetDefaults(CoordinatorConfigTable(), &c);
  return c;
}

WorkerDaemonConfig DefaultWorkerConfig() {
  WorkerDaemonConfig c;
  SetDefaults(WorkerConfigTable(), &c);
  return c;
}

absl::StatusOr<CoordinatorConfig> LoadCoordinatorConfig(const std::string& file,
                                                        const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(CoordinatorConfig c,
                   LoadConfig(file, overrides, DefaultCoordinatorConfig(), CoordinatorConfigTable().options));
  if (!ValidListen(c.listen())) {
    return absl::InvalidArgumentError(absl::StrCat("listen: '", c.listen(), "' must be host:port"));
  }
  if (!c.metrics_listen().empty() && !ValidListen(c.metrics_listen())) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", c.metrics_listen(), "' must be host:port or \"\""));
  }
  if (c.state_dir().empty()) return absl::InvalidArgumentError("state_dir: required");
  if (c.heartbeat_ms() >= c.lease_ms()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_ms: ", c.heartbeat_ms(), " must be < lease_ms = ", c.lease_ms()));
  }
  if (c.tls().cert().empty() != c.tls().key().empty()) {
    return absl::InvalidArgumentError("tls: set both cert and key, or neither");
  }
  if (c.tls().require_client_cert() && (c.tls().ca().empty() || c.tls().cert().empty())) {
    return absl::InvalidArgumentError("tls.require_client_cert: needs tls.cert, tls.key and tls.ca");
  }
  if (c.tls().cert().empty() && !c.insecure() && !IsLoopbackListen(c.listen())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen: '", c.listen(),
        "' is reachable from other machines but TLS is off, so tokens and worker credentials would cross the "
        "network in plaintext. Set tls.cert and tls.key (--tls-cert, --tls-key), listen on 127.0.0.1, or pass "
        "--insecure (insecure: true) on a network you trust"));
  }
  if (c.runs_dir().empty()) c.set_runs_dir(c.state_dir() + "/runs");
  return c;
}

absl::StatusOr<WorkerDaemonConfig> LoadWorkerConfig(const std::string& file,
                                                    const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(WorkerDaemonConfig c,
                   LoadConfig(file, overrides, DefaultWorkerConfig(), WorkerConfigTable().options));
  if (!ValidListen(c.coordinator())) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator: '", c.coordinator(), "' must be host:port"));
  }
  if (c.tls_cert().empty() != c.tls_key().empty()) {
    return absl::InvalidArgumentError("tls_cert: set both tls_cert and tls_key, or neither");
  }
  if (!c.tier_bandwidth().empty()) {
    if (auto tiers = ParseTierBandwidth(c.tier_bandwidth()); !tiers.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tier_bandwidth: ", tiers.status().message()));
    }
  }
  return c;
}

std::string CoordinatorConfigToYaml(const CoordinatorConfig& config) {
  return ProtoToYaml(config, CoordinatorConfigTable().options);
}
std::string WorkerConfigToYaml(const WorkerDaemonConfig& config) {
  return ProtoToYaml(config, WorkerConfigTable().options);
}

}  // namespace tandem::common
