#include "common/auth.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <openssl/sha.h>

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "common/yaml_proto.h"

namespace tandem::common {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  auto text = ReadTextFile(path, 1 << 20);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", text.status().message()));
  if (!absl::StrContains(*text, "-----BEGIN")) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", path, ": not a PEM file"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = ReadTextFile(path, kMaxTokenBytes + 64);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("token file ", text.status().message()));
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": empty"));
  if (token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": token too long"));
  }
  for (char c : token) {
    if (!absl::ascii_isgraph(c)) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": token has non-printable characters"));
    }
  }
  return token;
}

absl::StatusOr<std::string> LoadToken(const std::string& file, const char* env_var) {
  if (!file.empty()) return ReadTokenFile(file);
  const char* env = env_var ? std::getenv(env_var) : nullptr;
  if (env == nullptr) return std::string();
  std::string token(absl::StripAsciiWhitespace(env));
  if (token.size() > kMaxTokenBytes) return absl::InvalidArgumentError(absl::StrCat("$", env_var, ": too long"));
  return token;
}

std::vector<std::string> TokenFileWarnings(const std::string& path) {
  std::vector<std::string> out;
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return out;
  if ((st.st_mode & 077) != 0) {
    out.push_back(absl::StrCat("token file ", path, " is readable by ",
                               (st.st_mode & 07) != 0 ? "everyone" : "its group", " (mode ",
                               absl::StrFormat("%04o", st.st_mode & 07777), "): chmod 600 ", path));
  }
  return out;
}

absl::StatusOr<std::string> GenerateToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  char bytes[32];
  if (!in.read(bytes, sizeof(bytes))) return absl::InternalError("cannot read /dev/urandom");
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Length is not secret-dependent enough to matter here, but compare all
  // bytes of the longer string anyway.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? a[i] : 0;
    unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

TokenAuthenticator::TokenAuthenticator(std::string admin_token, std::string join_token, bool allow_unauthenticated)
    : admin_token_(std::move(admin_token)),
      join_token_(std::move(join_token)),
      allow_unauthenticated_(allow_unauthenticated) {}

Role TokenAuthenticator::Authenticate(const grpc::ServerContext& context) const {
  if (allow_unauthenticated_ && admin_token_.empty()) return Role::kAdmin;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return Role::kNone;
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.size() <= kBearer.size() ||
      !absl::StartsWithIgnoreCase(absl::string_view(value.data(), value.size()), "Bearer "))
    return Role::kNone;
  absl::string_view token = value.substr(kBearer.size());
  if (!admin_token_.empty() && ConstantTimeEquals(token, admin_token_)) return Role::kAdmin;
  if (!join_token_.empty() && ConstantTimeEquals(token, join_token_)) return Role::kWorker;
  return Role::kNone;
}

absl::Status TokenAuthenticator::Require(const grpc::ServerContext& context, Role needed) const {
  Role role = Authenticate(context);
  if (role == Role::kNone) {
    bool has = context.client_metadata().count("authorization") > 0;
    return absl::UnauthenticatedError(has ? "invalid token" : "missing token: send \"authorization: Bearer <token>\"");
  }
  if (static_cast<int>(role) < static_cast<int>(needed)) {
    return absl::PermissionDeniedError("this token may only call the Cluster service (worker join token)");
  }
  return absl::OkStatus();
}

std::string CredentialDigest(absl::string_view credential) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), digest);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string PresentedWorkerCredential(const grpc::ServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kWorkerCredentialMetadata);
  if (it == md.end() || it->second.size() > kMaxTokenBytes) return "";
  return std::string(it->second.data(), it->second.size());
}

void AddWorkerCredential(grpc::ClientContext* context, const std::string& credential) {
  if (!credential.empty()) context->AddMetadata(kWorkerCredentialMetadata, credential);
}

void AddBearerToken(grpc::ClientContext* context, const std::string& token) {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const std::string& cert_file,
                                                                               const std::string& key_file,
                                                                               const std::string& ca_file,
                                                                               bool require_client_cert) {
  if (cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(require_client_cert
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                            : ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                              : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(auto cert, ReadPem(cert_file, "tls.cert"));
  ASSIGN_OR_RETURN(auto key, ReadPem(key_file, "tls.key"));
  pair.cert_chain = cert;
  pair.private_key = key;
  options.pem_key_cert_pairs.push_back(pair);
  if (!ca_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(ca_file, "tls.ca"));
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& ca_file,
                                                                                 const std::string& cert_file,
                                                                                 const std::string& key_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(ca_file, "tls ca"));
  if (!cert_file.empty()) {
    ASSIGN_OR_RETURN(auto cert, ReadPem(cert_file, "tls cert"));
    ASSIGN_OR_RETURN(auto key, ReadPem(key_file, "tls key"));
    options.pem_cert_chain = cert;
    options.pem_private_key = key;
  }
  return grpc::SslCredentials(options);
}

}  // namespace tandem::common
