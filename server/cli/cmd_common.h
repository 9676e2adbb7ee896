// Helpers shared by the tandemctl command files: --help handling, parsing
// with a usage error, and building a client from the global flags.
#pragma once

#include <iostream>
#include <optional>
#include <string>

#include "server/cli/cli_args.h"
#include "server/cli/control_client.h"
#include "server/cli/exit_codes.h"

namespace tandem::cli {

// Global flags every command accepts (appended to each --help).
inline constexpr char kGlobalFlagsHelp[] =
    "Global flags:\n"
    "  --coordinator HOST:PORT  coordinator address (env TANDEM_COORDINATOR; default 127.0.0.1:7070)\n"
    "  --token-file PATH        admin token file (env TANDEM_ADMIN_TOKEN holds the token itself)\n"
    "  --tls-ca PATH            CA bundle: use TLS (env TANDEM_TLS_CA)\n"
    "  --tls-cert PATH          client certificate for mutual TLS (env TANDEM_TLS_CERT)\n"
    "  --tls-key PATH           its private key (env TANDEM_TLS_KEY)\n"
    "  --output text|json       output format (json: one object per line, for scripts)\n"
    "  --help                   this help\n"
    "Exit codes: 0 ok, 1 job failed / error, 2 usage or invalid input, 3 cancelled,\n"
    "            4 cannot reach the coordinator, 5 authentication.\n";

// Parses; on error prints it and sets *exit_code = 2; on --help prints usage
// and sets *exit_code = 0. Returns nullopt in both cases.
inline std::optional<ParsedArgs> ParseOrUsage(const std::vector<std::string>& args, const FlagSpec& spec,
                                              const std::string& usage, int* exit_code) {
  auto parsed = ParseArgs(args, spec);
  if (!parsed.ok()) {
    std::cerr << "tandemctl: " << parsed.status().message() << "\n\n" << usage;
    *exit_code = kExitUsage;
    return std::nullopt;
  }
  if (parsed->Has("help")) {
    std::cout << usage << "\n" << kGlobalFlagsHelp;
    *exit_code = kExitOk;
    return std::nullopt;
  }
  return std::move(*parsed);
}

inline std::optional<ControlClient> MakeClient(const ParsedArgs& args, int* exit_code) {
  auto options = ClientOptionsFromArgs(args);
  if (!options.ok()) {
    std::cerr << "tandemctl: " << options.status().message() << "\n";
    *exit_code = kExitUsage;
    return std::nullopt;
  }
  return std::optional<ControlClient>(std::in_place, *options);
}

}  // namespace tandem::cli
