#include "server/dashboard/dashboard.h"

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "server/dashboard/assets.h"
#include "server/dashboard/query_params.h"

namespace tandem::server {
namespace {

constexpr char kPrefix[] = "/dashboard/";
constexpr char kStatic[] = "/dashboard/static/";

// Same-origin scripts and styles only: no inline script, no CDN, no framing.
const std::vector<std::pair<std::string, std::string>>& PageHeaders() {
  static const std::vector<std::pair<std::string, std::string>> kHeaders = {
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"Cache-Control", "no-store"}};
  return kHeaders;
}

std::string HtmlEscape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}, {"'", "&#39;"}});
}

HttpResponse Html(int status, std::string body) {
  HttpResponse r{status, "text/html; charset=utf-8", std::move(body), PageHeaders()};
  return r;
}

HttpResponse Text(int status, const std::string& text) {
  return HttpResponse{status, "text/plain; charset=utf-8", text + "\n", {{"Cache-Control", "no-store"}}};
}

HttpResponse SeeOther(const std::string& location) {
  return HttpResponse{303, "text/plain; charset=utf-8", "", {{"Location", location}, {"Cache-Control", "no-store"}}};
}

std::string AssetText(std::string_view name) {
  const EmbeddedAsset* a = FindAsset(name);
  return a == nullptr ? std::string() : std::string(a->data);
}

// The login form with `message` (HTML-escaped) above it.
HttpResponse LoginPage(int status, const std::string& message) {
  return Html(status, absl::StrReplaceAll(AssetText("login.html"), {{"{{message}}", HtmlEscape(message)}}));
}

}  // namespace

Dashboard::Dashboard(JobManager* jobs, Membership* membership, const PhaseTimeline* timeline, const Clock* clock,
                     std::string admin_token, bool insecure)
    : access_(std::move(admin_token), insecure, clock), api_(jobs, membership, timeline, clock) {}

void Dashboard::Register(HttpServer* server) {
  server->Handle("/dashboard", [](const HttpRequest&) {
    return HttpResponse{302, "text/plain; charset=utf-8", "", {{"Location", kPrefix}}};
  });
  server->Handle(kPrefix, [this](const HttpRequest& r) { return Page(r); });
  server->Handle(
      "/dashboard/login", [this](const HttpRequest& r) { return r.method == "POST" ? LoginPost(r) : LoginForm(r); },
      /*allow_post=*/true);
  server->Handle(
      "/dashboard/logout", [this](const HttpRequest& r) { return Logout(r); }, /*allow_post=*/true);
  server->HandlePrefix(kStatic, [this](const HttpRequest& r) { return Static(r); });
  server->HandlePrefix(kPrefix, [](const HttpRequest&) { return Text(404, "not found"); });
  server->Handle("/dashboard/api/cluster", [this](const HttpRequest& r) { return Api(r, &DashboardApi::Cluster); });
  server->Handle("/dashboard/api/jobs", [this](const HttpRequest& r) { return Api(r, &DashboardApi::Jobs); });
  server->Handle("/dashboard/api/job", [this](const HttpRequest& r) { return Api(r, &DashboardApi::Job); });
  server->Handle("/dashboard/api/events", [this](const HttpRequest& r) { return Api(r, &DashboardApi::Events); });
}

HttpResponse Dashboard::Page(const HttpRequest& request) {
  const auto d = access_.Check(request);
  switch (d.verdict) {
    case DashboardAccess::Verdict::kForbidden:
      return Text(403, d.message);
    case DashboardAccess::Verdict::kUnauthenticated:
      return LoginPage(401, "");
    case DashboardAccess::Verdict::kAllowed:
      break;
  }
  return Html(200, AssetText("index.html"));
}

HttpResponse Dashboard::LoginForm(const HttpRequest& request) {
  const auto d = access_.CheckPeer(request);
  if (d.verdict != DashboardAccess::Verdict::kAllowed) return Text(403, d.message);
  if (access_.open()) return SeeOther(kPrefix);
  return LoginPage(200, "");
}

HttpResponse Dashboard::LoginPost(const HttpRequest& request) {
  const auto d = access_.CheckPeer(request);
  if (d.verdict != DashboardAccess::Verdict::kAllowed) return Text(403, d.message);
  if (access_.open()) return SeeOther(kPrefix);
  const std::string type = request.Header("content-type");
  if (!absl::StartsWith(type, "application/x-www-form-urlencoded")) {
    return Text(415, "login: send the form as application/x-www-form-urlencoded (token=...)");
  }
  auto form = QueryParams::Parse(absl::StripAsciiWhitespace(request.body), {"token"});
  if (!form.ok()) return LoginPage(400, std::string(form.status().message()));
  auto session = access_.Login(request, form->Get("token"));
  if (!session.ok()) return LoginPage(401, std::string(session.status().message()));
  HttpResponse r = SeeOther(kPrefix);
  r.headers.emplace_back("Set-Cookie", access_.SessionCookie(*session));
  return r;
}

HttpResponse Dashboard::Logout(const HttpRequest& request) {
  if (request.method != "POST") return Text(405, "log out with POST");
  access_.Logout(request);
  HttpResponse r = SeeOther("/dashboard/login");
  r.headers.emplace_back("Set-Cookie", access_.SessionCookie(""));
  return r;
}

HttpResponse Dashboard::Static(const HttpRequest& request) const {
  const auto d = access_.CheckPeer(request);
  if (d.verdict != DashboardAccess::Verdict::kAllowed) return Text(403, d.message);
  // Exact names of embedded files only: no directories, no decoding, so
  // "..", "%2e%2e" and the like name nothing.
  const std::string name = request.path.substr(sizeof(kStatic) - 1);
  const EmbeddedAsset* asset = FindAsset(name);
  if (asset == nullptr || absl::EndsWith(name, ".html")) return Text(404, "not found");
  HttpResponse r{200, AssetContentType(name), std::string(asset->data), PageHeaders()};
  return r;
}

HttpResponse Dashboard::Api(const HttpRequest& request,
                            HttpResponse (DashboardApi::*call)(const HttpRequest&) const) const {
  const auto d = access_.Check(request);
  switch (d.verdict) {
    case DashboardAccess::Verdict::kForbidden:
      return JsonError(absl::PermissionDeniedError(d.message));
    case DashboardAccess::Verdict::kUnauthenticated:
      return JsonError(absl::UnauthenticatedError(d.message));
    case DashboardAccess::Verdict::kAllowed:
      break;
  }
  return (api_.*call)(request);
}

}  // namespace tandem::server
