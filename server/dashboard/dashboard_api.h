// The dashboard's JSON endpoints (GET, after DashboardAccess said yes):
//   /dashboard/api/cluster                  workers (device, memory, state, job) and job counts
//   /dashboard/api/jobs[?limit=N]           jobs, newest first, with their latest figures
//   /dashboard/api/job?id=ID[&window=S]     one job: state, members, recovery, checkpoints, and
//                                           the phase spans of the last S seconds (default 600)
//   /dashboard/api/events?id=ID[&after=SEQ] up to 256 of the job's events after SEQ (steps with
//                                           their metrics, recoveries, checkpoints, states)
// Bad parameters get 400 and unknown jobs 404, with {"error": "..."}.
// Reads the managers' thread-safe accessors only. Thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/clock.h"
#include "server/http_server.h"

namespace tandem::server {

class JobManager;
class Membership;
class PhaseTimeline;

HttpResponse JsonResponse(int status, const std::string& json);
// {"error": message} with the HTTP status of the code (400, 401, 403, 404, 500).
HttpResponse JsonError(const absl::Status& status);

class DashboardApi {
 public:
  DashboardApi(JobManager* jobs, Membership* membership, const PhaseTimeline* timeline, const Clock* clock)
      : jobs_(jobs), membership_(membership), timeline_(timeline), clock_(clock) {}

  HttpResponse Cluster(const HttpRequest& request) const;
  HttpResponse Jobs(const HttpRequest& request) const;
  HttpResponse Job(const HttpRequest& request) const;
  HttpResponse Events(const HttpRequest& request) const;

 private:
  JobManager* const jobs_;
  Membership* const membership_;
  const PhaseTimeline* const timeline_;
  const Clock* const clock_;
};

}  // namespace tandem::server
