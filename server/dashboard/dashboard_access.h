// Who may see the dashboard. The admin token of the Control API grants it,
// presented as "Authorization: Bearer <token>" or through the login form,
// which exchanges it for a session cookie (HttpOnly, SameSite=Strict,
// random 256 bits; the coordinator keeps only its digest, in memory, for
// session_lifetime; a restart logs everyone out).
//
// The HTTP port is plain text, so the peer's address decides first:
// - loopback clients (127.0.0.0/8, ::1; an SSH tunnel arrives as one): the
//   token is required, except when the coordinator runs without an admin
//   token (auth.allow_unauthenticated), where the dashboard is open;
// - other clients: only when an admin token is set and the coordinator runs
//   with `insecure` (the network is trusted, as for plaintext gRPC);
//   otherwise 403, whatever they present.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/clock.h"
#include "server/http_server.h"

namespace tandem::server {

inline constexpr char kSessionCookie[] = "tandem_session";

// 127.0.0.0/8, ::1 and ::ffff:127.x.x.x.
bool IsLoopbackAddress(const std::string& address);

class DashboardAccess {
 public:
  enum class Verdict {
    kAllowed,
    kUnauthenticated,  // 401: no token or session, or a wrong one
    kForbidden,        // 403: not from this peer, whatever it presents
  };
  struct Decision {
    Verdict verdict;
    std::string message;  // why not (empty when allowed)
  };

  DashboardAccess(std::string admin_token, bool insecure, const Clock* clock,
                  int64_t session_lifetime_ms = 12 * 3600 * 1000, size_t max_sessions = 256);

  // The peer rule alone (the login form is shown only to allowed peers).
  Decision CheckPeer(const HttpRequest& request) const;
  // The peer rule, then the bearer token or the session cookie.
  Decision Check(const HttpRequest& request) const;
  // A login with `token`: a fresh session id for the cookie, or
  // UNAUTHENTICATED (wrong token) / PERMISSION_DENIED (peer rule).
  absl::StatusOr<std::string> Login(const HttpRequest& request, const std::string& token);
  // Ends the request's session, if any.
  void Logout(const HttpRequest& request);
  // "tandem_session=ID; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=N"
  std::string SessionCookie(const std::string& session) const;
  bool open() const { return admin_token_.empty(); }

 private:
  bool ValidSession(const std::string& session) const;

  const std::string admin_token_;  // empty: auth.allow_unauthenticated
  const bool insecure_;
  const Clock* const clock_;
  const int64_t session_lifetime_ms_;
  const size_t max_sessions_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> sessions_ ABSL_GUARDED_BY(mu_);  // digest -> expiry (Clock::NowMs)
};

// The value of cookie `name` in a Cookie header ("" when absent).
std::string CookieValue(const std::string& header, const std::string& name);

}  // namespace tandem::server
