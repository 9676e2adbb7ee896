// ControlClient: tandemctl's connection to the coordinator's Control
// service. Resolves the address (--coordinator, TANDEM_COORDINATOR, default
// 127.0.0.1:7070), the admin token (--token-file, TANDEM_ADMIN_TOKEN; never
// printed) and TLS (--tls-ca: a CA bundle enables TLS). Every unary call gets
// a deadline; streams get none and are cancelled through their context.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/cli/cli_args.h"
#include "tandem/v1/control.grpc.pb.h"

namespace tandem::cli {

struct ClientOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string token;  // admin token ("" = none)
  std::string tls_ca_pem;
  std::string tls_cert_pem, tls_key_pem;  // client certificate (mutual TLS)
  std::chrono::milliseconds timeout{10000};
  bool json = false;  // --output json
};

// From the global flags and the environment. Errors: unreadable token/CA file.
absl::StatusOr<ClientOptions> ClientOptionsFromArgs(const ParsedArgs& args);

// Reads a token file: the first line, trimmed. Errors name the file, never the content.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

class ControlClient {
 public:
  explicit ControlClient(ClientOptions options);
  tandem::v1::Control::Stub& stub() { return *stub_; }
  const ClientOptions& options() const { return options_; }
  // Adds the token and (for timeout > 0) a deadline; default: options().timeout.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  void Prepare(grpc::ClientContext* ctx) const { Prepare(ctx, options_.timeout); }

 private:
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::Control::Stub> stub_;
};

// "tandemctl: cannot reach the coordinator at ADDR: ..." etc.; returns the exit code.
int ReportRpcError(const std::string& what, const grpc::Status& status, const ClientOptions& options);

}  // namespace tandem::cli
