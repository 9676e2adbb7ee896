#include "server/cli/control_client.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "server/cli/exit_codes.h"

namespace tandem::cli {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " file ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > (1 << 20)) return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " is over 1 MiB"));
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto text, ReadSmallFile(path, "token"));
  std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  return token;
}

absl::StatusOr<ClientOptions> ClientOptionsFromArgs(const ParsedArgs& args) {
  ClientOptions o;
  if (const char* env = std::getenv("TANDEM_COORDINATOR"); env != nullptr && *env) o.coordinator = env;
  if (args.Has("coordinator")) o.coordinator = args.Get("coordinator");
  if (args.Has("token-file")) {
    ASSIGN_OR_RETURN(o.token, ReadTokenFile(args.Get("token-file")));
  } else if (const char* env = std::getenv("TANDEM_ADMIN_TOKEN"); env != nullptr && *env) {
    o.token = std::string(absl::StripAsciiWhitespace(env));
  }
  std::string ca = args.Get("tls-ca");
  if (ca.empty()) {
    if (const char* env = std::getenv("TANDEM_TLS_CA"); env != nullptr) ca = env;
  }
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(o.tls_ca_pem, ReadSmallFile(ca, "CA"));
  }
  for (auto [flag, env, out] : {std::tuple{"tls-cert", "TANDEM_TLS_CERT", &o.tls_cert_pem},
                                std::tuple{"tls-key", "TANDEM_TLS_KEY", &o.tls_key_pem}}) {
    std::string path = args.Get(flag);
    if (path.empty()) {
      if (const char* e = std::getenv(env); e != nullptr) path = e;
    }
    if (path.empty()) continue;
    ASSIGN_OR_RETURN(auto pem, ReadSmallFile(path, flag));
    *out = pem;
  }
  if (o.tls_cert_pem.empty() != o.tls_key_pem.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together (mutual TLS)");
  }
  if (!o.tls_cert_pem.empty() && o.tls_ca_pem.empty()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca (the CA that signed the coordinator)");
  }
  const std::string output = args.Get("output", "text");
  if (output != "text" && output != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--output: expected text or json, got '", output, "'"));
  }
  o.json = output == "json";
  return o;
}

ControlClient::ControlClient(ClientOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options_.tls_ca_pem.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_ca_pem;
    ssl.pem_cert_chain = options_.tls_cert_pem;
    ssl.pem_private_key = options_.tls_key_pem;
    creds = grpc::SslCredentials(ssl);
  }
  channel_ = grpc::CreateCustomChannel(options_.coordinator, creds, args);
  stub_ = tandem::v1::Control::NewStub(channel_);
}

void ControlClient::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

int ReportRpcError(const std::string& what, const grpc::Status& status, const ClientOptions& options) {
  const int code = ExitCodeFor(status);
  std::string hint;
  if (code == kExitUnreachable) {
    hint = absl::StrCat(" (is tandem-coordinator running at ", options.coordinator,
                        "? set --coordinator or TANDEM_COORDINATOR)");
  } else if (code == kExitAuth) {
    hint = " (check --token-file or TANDEM_ADMIN_TOKEN: the Control service needs the admin token)";
  }
  std::cerr << "tandemctl: " << what << ": " << status.error_message() << hint << "\n";
  return code;
}

}  // namespace tandem::cli
