// tandem-coordinator: parses flags and the config file, runs the
// Coordinator until SIGTERM/SIGINT, then shuts down within a bound.
// Prints one machine-readable line to stdout when ready:
//   tandem-coordinator listening grpc=127.0.0.1:PORT metrics=127.0.0.1:PORT
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "common/daemon_config.h"
#include "common/logging.h"
#include "server/coordinator.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  using namespace tandem;
  auto args = common::ParseDaemonArgs(argc, argv, common::CoordinatorFlags());
  if (!args.ok()) {
    std::cerr << "tandem-coordinator: " << args.status().message() << "\n";
    return 2;
  }
  if (args->help) {
    std::cout << common::DaemonUsage("tandem-coordinator",
                                     "The Tandem coordinator: jobs, scheduling, membership, rendezvous store.",
                                     common::CoordinatorFlags());
    return 0;
  }
  if (!args->positional.empty()) {
    std::cerr << "tandem-coordinator: unexpected argument '" << args->positional[0] << "' (see --help)\n";
    return 2;
  }
  auto config = common::LoadCoordinatorConfig(args->config_file, args->overrides);
  if (!config.ok()) {
    std::cerr << "tandem-coordinator: " << config.status().message() << "\n";
    return 2;
  }
  if (auto s = common::SetupLogging("coordinator", config->log_level(), config->log_file(), config->log_max_bytes(),
                                    config->log_max_files());
      !s.ok()) {
    std::cerr << "tandem-coordinator: " << s.message() << "\n";
    return 2;
  }
  spdlog::info("effective config:\n{}", common::CoordinatorConfigToYaml(*config));

  // Block the signals in every thread; the main thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  server::Coordinator coordinator(*config);
  if (auto s = coordinator.Start(); !s.ok()) {
    spdlog::error("start failed: {}", s.ToString());
    std::cerr << "tandem-coordinator: " << s.message() << "\n";
    coordinator.Shutdown();
    return 1;
  }
  std::cout << coordinator.ReadyLine() << std::endl;
  spdlog::info("{}", coordinator.ReadyLine());
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("signal {}: stopping", sig);
  coordinator.Shutdown();
  return 0;
}
