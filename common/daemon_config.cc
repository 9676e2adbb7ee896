#include "common/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "common/yaml_proto.h"

namespace tandem::common {
namespace {

using tandem::v1::CoordinatorConfig;
using tandem::v1::WorkerDaemonConfig;

constexpr size_t kMaxConfigBytes = 1 << 20;

const YamlProtoOptions& CoordinatorOptions() {
  static const YamlProtoOptions* o = [] {
    auto* o = new YamlProtoOptions;
    o->max_text_bytes = kMaxConfigBytes;
    o->rules = {
        {.path = "listen", .max_len = 256},
        {.path = "metrics_listen", .max_len = 256},
        {.path = "lease_ms", .min = 100, .max = 3.6e6},
        {.path = "heartbeat_ms", .min = 10, .max = 3.6e6},
        {.path = "phase_timeout_ms", .min = 100, .max = 7 * 24 * 3.6e6},
        {.path = "setup_timeout_ms", .min = 100, .max = 7 * 24 * 3.6e6},
        {.path = "max_message_bytes", .min = 1 << 16, .max = 1 << 30},
        {.path = "reattach_grace_ms", .min = 0, .max = 3.6e6},
        {.path = "shutdown_grace_ms", .min = 0, .max = 600000},
        {.path = "log_level", .one_of = {"trace", "debug", "info", "warn", "error", "off"}},
        {.path = "grpc_threads", .min = 4, .max = 65536},
        {.path = "log_max_bytes", .min = 4096, .max = 1e12},
        {.path = "log_max_files", .min = 1, .max = 1000},
        {.path = "lost_worker_retention_ms", .min = 0, .max = 365 * 24 * 3.6e6},
        {.path = "max_finished_jobs", .min = 1, .max = 10000000},
        {.path = "finished_job_retention_s", .min = 0, .max = 100 * 365 * 86400.0},
    };
    return o;
  }();
  return *o;
}

const YamlProtoOptions& WorkerOptions() {
  static const YamlProtoOptions* o = [] {
    auto* o = new YamlProtoOptions;
    o->max_text_bytes = kMaxConfigBytes;
    o->rules = {
        {.path = "coordinator", .max_len = 256},
        {.path = "name", .max_len = 128},
        {.path = "device", .one_of = {"cpu", "cuda", "cpu-guarded"}},
        {.path = "data_address", .max_len = 256},
        {.path = "node", .max_len = 128},
        {.path = "threads", .min = 0, .max = 1024},
        {.path = "log_level", .one_of = {"trace", "debug", "info", "warn", "error", "off"}},
        {.path = "device_index", .min = 0, .max = 1024},
        {.path = "preempt_timeout_ms", .min = 0, .max = 3.6e6},
        {.path = "log_max_bytes", .min = 4096, .max = 1e12},
        {.path = "log_max_files", .min = 1, .max = 1000},
    };
    return o;
  }();
  return *o;
}

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
absl::StatusOr<Config> LoadConfig(const std::string& file, const std::vector<std::string>& overrides,
                                  Config config, const YamlProtoOptions& options) {
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

}  // namespace

const std::vector<DaemonFlag>& CoordinatorFlags() {
  static const auto* flags = new std::vector<DaemonFlag>{
      {"listen", "listen", "gRPC address host:port (port 0 = ephemeral) [127.0.0.1:7070]"},
      {"insecure", "insecure",
       "allow plaintext gRPC on a non-loopback address (tokens cross the network unencrypted)", true},
      {"state-dir", "state_dir", "directory of coordinator.db [tandem-state]"},
      {"metrics-listen", "metrics_listen", "HTTP metrics/health address, \"\" = off [0.0.0.0:7071]"},
      {"admin-token-file", "auth.admin_token_file", "admin token file (else $TANDEM_ADMIN_TOKEN)"},
      {"join-token-file", "auth.join_token_file", "worker join token file (else $TANDEM_JOIN_TOKEN)"},
      {"lease-ms", "lease_ms", "worker lease in ms [5000]"},
      {"heartbeat-ms", "heartbeat_ms", "worker heartbeat interval in ms [1000]"},
      {"phase-timeout-ms", "phase_timeout_ms", "timeout of one phase in ms [600000]"},
      {"runs-dir", "runs_dir", "job run directories [<state-dir>/runs]"},
      {"tls-cert", "tls.cert", "PEM server certificate"},
      {"tls-key", "tls.key", "PEM server private key"},
      {"tls-ca", "tls.ca", "PEM CA for client certificates"},
      {"tls-require-client-cert", "tls.require_client_cert", "mutual TLS", true},
      {"log-level", "log_level", "trace|debug|info|warn|error [info]"},
      {"log-file", "log_file", "also log to this file"},
  };
  return *flags;
}

const std::vector<DaemonFlag>& WorkerFlags() {
  static const auto* flags = new std::vector<DaemonFlag>{
      {"coordinator", "coordinator", "coordinator host:port (else $TANDEM_COORDINATOR) [127.0.0.1:7070]"},
      {"name", "name", "stable worker name [hostname-pid]"},
      {"device", "device", "cpu | cuda | cpu-guarded (debug: CPU compute through the device code path) [cpu]"},
      {"device-index", "device_index", "GPU index for cuda (ignored when CUDA_VISIBLE_DEVICES is set) [0]"},
      {"data-address", "data_address", "interface for collectives [127.0.0.1]"},
      {"node", "node", "the machine this worker runs on; workers with the same node share the intra-node tier "
                       "[host name]"},
      {"threads", "threads", "compute threads, 0 = all cores [0]"},
      {"token-file", "token_file", "join token file (else $TANDEM_JOIN_TOKEN)"},
      {"tls-ca", "tls_ca", "PEM CA to verify the coordinator (enables TLS)"},
      {"tls-cert", "tls_cert", "PEM client certificate (mutual TLS)"},
      {"tls-key", "tls_key", "PEM client key (mutual TLS)"},
      {"preempt-timeout-ms", "preempt_timeout_ms",
       "SIGTERM in a job: wait this long for the coordinator to checkpoint and release the worker; "
       "a second SIGTERM or SIGINT stops at once; 0 = stop at once [25000]"},
      {"log-level", "log_level", "trace|debug|info|warn|error [info]"},
      {"log-file", "log_file", "also log to this file"},
  };
  return *flags;
}

absl::StatusOr<DaemonArgs> ParseDaemonArgs(int argc, const char* const* argv,
                                           const std::vector<DaemonFlag>& flags) {
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

std::string DaemonUsage(const std::string& program, const std::string& summary,
                        const std::vector<DaemonFlag>& flags) {
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
  c.set_listen("127.0.0.1:7070");
  c.set_state_dir("tandem-state");
  c.set_metrics_listen("0.0.0.0:7071");
  c.set_lease_ms(5000);
  c.set_heartbeat_ms(1000);
  c.set_phase_timeout_ms(600000);
  c.set_setup_timeout_ms(600000);
  c.set_max_message_bytes(16 << 20);
  c.set_reattach_grace_ms(30000);
  c.set_shutdown_grace_ms(5000);
  c.set_log_level("info");
  c.set_grpc_threads(512);
  c.set_log_max_bytes(64 << 20);
  c.set_log_max_files(5);
  c.set_lost_worker_retention_ms(3600 * 1000);
  c.set_max_finished_jobs(1000);
  c.set_finished_job_retention_s(30 * 86400);
  c.mutable_tls();
  c.mutable_auth();
  return c;
}

WorkerDaemonConfig DefaultWorkerConfig() {
  WorkerDaemonConfig c;
  c.set_coordinator("127.0.0.1:7070");
  c.set_device("cpu");
  c.set_data_address("127.0.0.1");
  // Below the usual grace of orchestrators (Kubernetes and Slurm's KillWait:
  // 30 s) so the worker leaves on its own before a SIGKILL.
  c.set_preempt_timeout_ms(25000);
  c.set_log_level("info");
  c.set_log_max_bytes(64 << 20);
  c.set_log_max_files(5);
  return c;
}

absl::StatusOr<CoordinatorConfig> LoadCoordinatorConfig(const std::string& file,
                                                        const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(CoordinatorConfig c,
                   LoadConfig(file, overrides, DefaultCoordinatorConfig(), CoordinatorOptions()));
  if (!ValidListen(c.listen())) {
    return absl::InvalidArgumentError(absl::StrCat("listen: '", c.listen(), "' must be host:port"));
  }
  if (!c.metrics_listen().empty() && !ValidListen(c.metrics_listen())) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: '", c.metrics_listen(), "' must be host:port or \"\""));
  }
  if (c.state_dir().empty()) return absl::InvalidArgumentError("state_dir: required");
  if (c.heartbeat_ms() >= c.lease_ms()) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat_ms: ", c.heartbeat_ms(),
                                                   " must be < lease_ms = ", c.lease_ms()));
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
                   LoadConfig(file, overrides, DefaultWorkerConfig(), WorkerOptions()));
  if (!ValidListen(c.coordinator())) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator: '", c.coordinator(), "' must be host:port"));
  }
  if (c.tls_cert().empty() != c.tls_key().empty()) {
    return absl::InvalidArgumentError("tls_cert: set both tls_cert and tls_key, or neither");
  }
  return c;
}

std::string CoordinatorConfigToYaml(const CoordinatorConfig& config) {
  return ProtoToYaml(config, CoordinatorOptions());
}
std::string WorkerConfigToYaml(const WorkerDaemonConfig& config) {
  return ProtoToYaml(config, WorkerOptions());
}

}  // namespace tandem::common
