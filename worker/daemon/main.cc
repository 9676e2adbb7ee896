// tandem-worker: one per device. Reads configs/worker.yaml (--config) and
// flags (see --help), registers with the coordinator, runs the phases it is
// told to run with the job engine. SIGTERM in a job is a preemption: the
// worker keeps working until the coordinator has checkpointed and released it
// (--preempt-timeout-ms at most); SIGINT, a second signal, or SIGTERM with no
// job stop it cleanly: the phase in progress gets a grace period, is
// reported, and the process exits within a bound (a watchdog enforces it). Exit codes: 0 clean stop, 1
// runtime error, 2 bad flags or config, 5 credentials rejected.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/bandwidth.h"
#include "common/daemon_config.h"
#include "common/logging.h"
#include "common/rank_topology.h"
#include "worker/daemon/host_info.h"
#include "worker/daemon/worker_daemon.h"
#include "worker/engine/engine.h"

namespace {

constexpr auto kShutdownGrace = std::chrono::seconds(20);
// Hard bound after the first signal, beyond the preemption timeout: grace +
// report retries + slack.
constexpr auto kExitWatchdog = std::chrono::seconds(45);

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

int Fail(const std::string& what, int code) {
  std::cerr << "tandem-worker: " << what << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  // SIGTERM/SIGINT: the handler only writes to a pipe (async-signal safe,
  // whichever thread takes it - OpenBLAS and gRPC start threads early);
  // a watcher thread reads it and stops the daemon.
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) return Fail("pipe2 failed", 1);
  {
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
  }
  const auto& flags = common::WorkerFlags();
  auto args = common::ParseDaemonArgs(argc, argv, flags);
  const std::string summary =
      "Tandem worker daemon: registers with the coordinator and runs the phases of its job.\n"
      "data_address \"auto\" (or empty) picks the local address that routes to the coordinator.";
  if (!args.ok()) {
    std::cerr << "tandem-worker: " << args.status().message() << "\n\n"
              << common::DaemonUsage("tandem-worker", summary, flags);
    return 2;
  }
  if (args->help) {
    std::cout << common::DaemonUsage("tandem-worker", summary, flags);
    return 0;
  }
  if (!args->positional.empty()) return Fail("unexpected argument '" + args->positional[0] + "'", 2);
  // TANDEM_COORDINATOR sits between the config file and the flags.
  std::vector<std::string> overrides;
  if (const char* env = std::getenv("TANDEM_COORDINATOR"); env != nullptr && *env) {
    overrides.push_back(absl::StrCat("coordinator=", env));
  }
  overrides.insert(overrides.end(), args->overrides.begin(), args->overrides.end());
  auto config = common::LoadWorkerConfig(args->config_file, overrides);
  if (!config.ok()) return Fail(std::string(config.status().message()), 2);
  // --speed names a speed: 0 is "none" only as the default.
  for (const std::string& o : args->overrides) {
    if (absl::StartsWith(o, "speed=") && config->speed() == 0) {
      return Fail("config: speed: must be > 0, got 0 (leave --speed out to calibrate at setup)", 2);
    }
  }
  if (config->name().empty()) config->set_name(absl::StrCat(worker::HostName(), "-", getpid()));
  if (config->node().empty()) config->set_node(worker::HostName());
  if (absl::Status st = common::CheckNodeName(config->node()); !st.ok()) return Fail(std::string(st.message()), 2);
  common::TierBandwidth tiers;
  if (!config->tier_bandwidth().empty()) {
    auto parsed = common::ParseTierBandwidth(config->tier_bandwidth());
    if (!parsed.ok()) return Fail(absl::StrCat("--tier-bandwidth: ", parsed.status().message()), 2);
    tiers = *parsed;
  }
  if (absl::Status st = common::SetupLogging("tandem-worker", config->log_level(), config->log_file(),
                                             config->log_max_bytes(), config->log_max_files());
      !st.ok()) {
    return Fail(std::string(st.message()), 2);
  }
  auto token = common::LoadToken(config->token_file(), common::kJoinTokenEnv);
  if (!token.ok()) return Fail(std::string(token.status().message()), 2);
  auto creds = common::MakeChannelCredentials(config->tls_ca(), config->tls_cert(), config->tls_key());
  if (!creds.ok()) return Fail(std::string(creds.status().message()), 2);
  std::string data_address = config->data_address();
  if (data_address.empty() || data_address == "auto") {
    data_address = worker::LocalAddressTowards(config->coordinator());
  }
  if (config->device() == "cuda" && std::getenv("CUDA_VISIBLE_DEVICES") == nullptr) {
    // One worker per GPU: the chosen device becomes device 0 for the engine.
    setenv("CUDA_VISIBLE_DEVICES", absl::StrCat(config->device_index()).c_str(), 1);
  }
  spdlog::info("tandem-worker {} effective config:\n{}", TANDEM_VERSION, common::WorkerConfigToYaml(*config));
  if (token->empty()) spdlog::warn("no join token (--token-file or TANDEM_JOIN_TOKEN): calls are unauthenticated");
  for (const auto& warning : common::TokenFileWarnings(config->token_file())) spdlog::warn("{}", warning);

  worker::WorkerDaemonOptions options;
  options.coordinator = config->coordinator();
  options.name = config->name();
  options.device = config->device();
  options.data_address = data_address;
  options.node = config->node();
  options.intra_bytes_per_s = tiers.intra_bytes_per_s;
  options.inter_bytes_per_s = tiers.inter_bytes_per_s;
  options.threads = config->threads();
  options.speed = config->speed();
  options.token = *token;
  options.credentials = *creds;
  options.version = TANDEM_VERSION;
  options.shutdown_grace = kShutdownGrace;
  options.preempt_timeout = std::chrono::milliseconds(config->preempt_timeout_ms());
  worker::EngineOptions engine_options;
  engine_options.coordinator_address = config->coordinator();
  engine_options.auth_token = *token;
  // The engine's rendezvous-store channel uses the same TLS settings.
  engine_options.tls_ca = config->tls_ca();
  engine_options.tls_cert = config->tls_cert();
  engine_options.tls_key = config->tls_key();
  engine_options.data_address = data_address;
  engine_options.num_threads = config->threads();
  engine_options.speed = config->speed();
  engine_options.device = config->device();
  worker::WorkerDaemon daemon(
      options, [engine_options](const std::string& worker_id, std::function<std::string()> credential) mutable {
        engine_options.worker_id = worker_id;
        engine_options.worker_credential = std::move(credential);
        return worker::MakeJobEngine(engine_options);
      });

  std::thread signal_thread([&] {
    unsigned char b = 0;
    bool first = true;
    while (true) {
      const ssize_t n = read(g_signal_pipe[0], &b, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || b == 0) return;  // 0: main's stop byte
      if (b == SIGTERM && first) {
        // Graceful preemption: leave at the job's next step boundary.
        spdlog::info("tandem-worker: received {}", strsignal(b));
        daemon.RequestPreempt();
      } else {
        spdlog::info("tandem-worker: received {}, stopping", strsignal(b));
        daemon.RequestStop();
      }
      if (!first) continue;
      first = false;
      // Watchdog: whatever hangs, the process ends within the bound.
      const auto bound = kExitWatchdog + std::chrono::duration_cast<std::chrono::seconds>(options.preempt_timeout);
      std::thread([bound] {
        std::this_thread::sleep_for(bound);
        spdlog::error("tandem-worker: did not stop within {} s; exiting", bound.count());
        spdlog::shutdown();
        _exit(1);
      }).detach();
    }
  });
  absl::Status st = daemon.Run();
  const unsigned char stop = 0;
  (void)!write(g_signal_pipe[1], &stop, 1);
  signal_thread.join();
  if (!st.ok()) {
    spdlog::error("tandem-worker: {}", st.ToString());
    return st.code() == absl::StatusCode::kUnauthenticated || st.code() == absl::StatusCode::kPermissionDenied ? 5 : 1;
  }
  return 0;
}
