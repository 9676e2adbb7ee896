// Authentication for both services: bearer tokens in the "authorization"
// metadata ("Bearer <token>"), compared in constant time and never logged;
// TLS credentials for servers (cert + key, optional client-cert CA) and
// clients (CA, optional client cert + key for mutual TLS).
//
// Roles: the admin token may call everything; the join token may call only
// the Cluster service. Missing/wrong token -> UNAUTHENTICATED; a valid token
// of the wrong role -> PERMISSION_DENIED. Thread-safe after construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ServerContext;
class ClientContext;
class ServerCredentials;
class ChannelCredentials;
class Status;
}  // namespace grpc

namespace tandem::common {

inline constexpr char kAdminTokenEnv[] = "TANDEM_ADMIN_TOKEN";
inline constexpr char kJoinTokenEnv[] = "TANDEM_JOIN_TOKEN";
inline constexpr size_t kMaxTokenBytes = 4096;

// Reads a token file: surrounding whitespace trimmed; empty, oversized or
// non-printable content is an error (the message never contains the token).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);
// What is wrong with how a token file is kept (empty when nothing): e.g.
// readable by group or others. The daemons log these as warnings.
std::vector<std::string> TokenFileWarnings(const std::string& path);
// The token from `file` when set, else from the environment variable, else "".
absl::StatusOr<std::string> LoadToken(const std::string& file, const char* env_var);
// A fresh random token (hex, 256 bits from /dev/urandom).
absl::StatusOr<std::string> GenerateToken();

bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

enum class Role { kNone = 0, kWorker = 1, kAdmin = 2 };

class TokenAuthenticator {
 public:
  // An empty admin token with allow_unauthenticated = false rejects every
  // call. An empty join token means workers use the admin token.
  TokenAuthenticator(std::string admin_token, std::string join_token, bool allow_unauthenticated);

  // The role the call's bearer token grants.
  Role Authenticate(const grpc::ServerContext& context) const;
  // OK when the call may proceed with `needed`; else UNAUTHENTICATED or
  // PERMISSION_DENIED with a message naming what is missing.
  absl::Status Require(const grpc::ServerContext& context, Role needed) const;

 private:
  std::string admin_token_;
  std::string join_token_;
  bool allow_unauthenticated_;
};

// Per-worker credentials. RegisterWorker hands each worker a fresh secret
// (GenerateToken); the coordinator keeps only its digest. The worker sends
// it with every later Cluster call in this metadata key.
inline constexpr char kWorkerCredentialMetadata[] = "x-tandem-worker-credential";
// Hex SHA-256 of a credential (what the coordinator stores and compares).
std::string CredentialDigest(absl::string_view credential);
// The credential a call presents ("" when none).
std::string PresentedWorkerCredential(const grpc::ServerContext& context);
// Adds the credential metadata to a client call (no-op if empty).
void AddWorkerCredential(grpc::ClientContext* context, const std::string& credential);

// Adds "authorization: Bearer <token>" to a client call (no-op if empty).
void AddBearerToken(grpc::ClientContext* context, const std::string& token);

// Insecure when cert_file is empty. Files are read here; errors name the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const std::string& cert_file,
                                                                               const std::string& key_file,
                                                                               const std::string& ca_file,
                                                                               bool require_client_cert);
// Insecure when ca_file is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& ca_file,
                                                                                 const std::string& cert_file = "",
                                                                                 const std::string& key_file = "");

}  // namespace tandem::common
