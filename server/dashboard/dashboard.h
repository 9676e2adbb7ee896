// The live web dashboard on the coordinator's HTTP port: static pages
// embedded in the binary (assets.h) and JSON endpoints (dashboard_api.h),
// behind DashboardAccess (admin token or login session; peer rules).
//   /dashboard/               the dashboard (401 with the login form when not logged in)
//   /dashboard/login          GET: the form; POST token=...: sets the session cookie
//   /dashboard/logout         POST: ends the session
//   /dashboard/static/NAME    an embedded file (exact names only)
//   /dashboard/api/...        JSON, see dashboard_api.h
// Read-only: nothing here changes a job or a worker. Handlers run on the
// HttpServer's loop thread; the managers must outlive the server. Thread-safe.
#pragma once

#include <string>

#include "server/clock.h"
#include "server/dashboard/dashboard_access.h"
#include "server/dashboard/dashboard_api.h"
#include "server/http_server.h"

namespace tandem::server {

class Dashboard {
 public:
  // admin_token empty: auth.allow_unauthenticated (loopback clients only).
  Dashboard(JobManager* jobs, Membership* membership, const PhaseTimeline* timeline, const Clock* clock,
            std::string admin_token, bool insecure);
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // Adds the routes (before server->Start).
  void Register(HttpServer* server);

 private:
  HttpResponse Page(const HttpRequest& request);
  HttpResponse LoginForm(const HttpRequest& request);
  HttpResponse LoginPost(const HttpRequest& request);
  HttpResponse Logout(const HttpRequest& request);
  HttpResponse Static(const HttpRequest& request) const;
  // The API call when access allows it, else its 401/403 as JSON.
  HttpResponse Api(const HttpRequest& request, HttpResponse (DashboardApi::*call)(const HttpRequest&) const) const;

  DashboardAccess access_;
  DashboardApi api_;
};

}  // namespace tandem::server
