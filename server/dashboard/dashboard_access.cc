#include "server/dashboard/dashboard_access.h"

#include <arpa/inet.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/auth.h"
#include "common/base/status_macros.h"

namespace tandem::server {
namespace {

constexpr char kSeeDocs[] = "see the Dashboard section of docs/operations.md";

// The token of "Bearer <token>" ("" when the header is not one).
std::string BearerToken(const std::string& header) {
  absl::string_view v = absl::StripAsciiWhitespace(header);
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) return "";
  return std::string(absl::StripAsciiWhitespace(v.substr(7)));
}

}  // namespace

bool IsLoopbackAddress(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return false;
  static const unsigned char kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  if (std::equal(v6.s6_addr, v6.s6_addr + 16, kLoopback)) return true;
  static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::equal(v6.s6_addr, v6.s6_addr + 12, kMapped) && v6.s6_addr[12] == 127;
}

std::string CookieValue(const std::string& header, const std::string& name) {
  for (absl::string_view part : absl::StrSplit(header, ';')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    if (eq != absl::string_view::npos && part.substr(0, eq) == name) return std::string(part.substr(eq + 1));
  }
  return "";
}

DashboardAccess::DashboardAccess(std::string admin_token, bool insecure, const Clock* clock,
                                 int64_t session_lifetime_ms, size_t max_sessions)
    : admin_token_(std::move(admin_token)),
      insecure_(insecure),
      clock_(clock),
      session_lifetime_ms_(session_lifetime_ms),
      max_sessions_(std::max<size_t>(1, max_sessions)) {}

DashboardAccess::Decision DashboardAccess::CheckPeer(const HttpRequest& request) const {
  if (IsLoopbackAddress(request.peer)) return {Verdict::kAllowed, ""};
  if (admin_token_.empty()) {
    return {Verdict::kForbidden,
            absl::StrCat("the coordinator runs without an admin token (auth.allow_unauthenticated): the dashboard "
                         "answers loopback clients only; open it through an SSH tunnel (",
                         kSeeDocs, ")")};
  }
  if (!insecure_) {
    return {Verdict::kForbidden,
            absl::StrCat("the dashboard is plain HTTP: from another machine it needs the coordinator's --insecure "
                         "(a trusted network) or an SSH tunnel to the coordinator's host (",
                         kSeeDocs, ")")};
  }
  return {Verdict::kAllowed, ""};
}

DashboardAccess::Decision DashboardAccess::Check(const HttpRequest& request) const {
  Decision peer = CheckPeer(request);
  if (peer.verdict != Verdict::kAllowed || admin_token_.empty()) return peer;
  const std::string authorization = request.Header("authorization");
  if (!authorization.empty()) {
    const std::string token = BearerToken(authorization);
    if (token.empty()) return {Verdict::kUnauthenticated, "authorization: expected 'Bearer <admin token>'"};
    if (!common::ConstantTimeEquals(token, admin_token_)) {
      return {Verdict::kUnauthenticated, "wrong token: the dashboard needs the admin token"};
    }
    return {Verdict::kAllowed, ""};
  }
  const std::string session = CookieValue(request.Header("cookie"), kSessionCookie);
  if (session.empty()) {
    return {Verdict::kUnauthenticated,
            "no token: send 'Authorization: Bearer <admin token>' or log in at /dashboard/login"};
  }
  if (!ValidSession(session)) return {Verdict::kUnauthenticated, "session expired or unknown: log in again"};
  return {Verdict::kAllowed, ""};
}

bool DashboardAccess::ValidSession(const std::string& session) const {
  const std::string digest = common::CredentialDigest(session);
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(digest);
  return it != sessions_.end() && it->second > clock_->NowMs();
}

absl::StatusOr<std::string> DashboardAccess::Login(const HttpRequest& request, const std::string& token) {
  if (Decision peer = CheckPeer(request); peer.verdict != Verdict::kAllowed) {
    return absl::PermissionDeniedError(peer.message);
  }
  if (admin_token_.empty()) return absl::FailedPreconditionError("no admin token is set: no login needed");
  if (token.empty() || !common::ConstantTimeEquals(token, admin_token_)) {
    return absl::UnauthenticatedError("wrong token: the dashboard needs the admin token");
  }
  ASSIGN_OR_RETURN(auto session, common::GenerateToken());
  const int64_t now = clock_->NowMs();
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second <= now ? sessions_.erase(it) : std::next(it);
  }
  if (sessions_.size() >= max_sessions_) {
    // Full: the session closest to expiry goes.
    sessions_.erase(std::min_element(sessions_.begin(), sessions_.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; }));
  }
  sessions_[common::CredentialDigest(session)] = now + session_lifetime_ms_;
  return session;
}

void DashboardAccess::Logout(const HttpRequest& request) {
  const std::string session = CookieValue(request.Header("cookie"), kSessionCookie);
  if (session.empty()) return;
  absl::MutexLock lock(&mu_);
  sessions_.erase(common::CredentialDigest(session));
}

std::string DashboardAccess::SessionCookie(const std::string& session) const {
  return absl::StrCat(kSessionCookie, "=", session, "; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=",
                      session.empty() ? 0 : session_lifetime_ms_ / 1000);
}

}  // namespace tandem::server
