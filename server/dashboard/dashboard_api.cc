#include "server/dashboard/dashboard_api.h"

#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/api/request_checks.h"
#include "server/dashboard/phase_timeline.h"
#include "server/dashboard/query_params.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/phase_plan.h"
#include "server/membership/membership.h"

namespace tandem::server {
namespace {

using nlohmann::json;

constexpr int kMaxJobs = 500;
constexpr int64_t kMaxWindowSeconds = 7 * 24 * 3600;

std::string EnumName(const std::string& full, const std::string& prefix) {
  std::string n = full.rfind(prefix, 0) == 0 ? full.substr(prefix.size()) : full;
  return absl::AsciiStrToLower(n);
}

std::string WorkerStateName(tandem::v1::WorkerState s) {
  return EnumName(tandem::v1::WorkerState_Name(s), "WORKER_STATE_");
}
std::string DeviceName(tandem::v1::DeviceKind d) { return EnumName(tandem::v1::DeviceKind_Name(d), "DEVICE_KIND_"); }
std::string KindName(tandem::v1::JobKind k) { return EnumName(tandem::v1::JobKind_Name(k), "JOB_KIND_"); }

// NaN and infinities are not JSON: null instead.
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json JobSummary(const tandem::v1::Job& j) {
  const auto& m = j.latest();
  return json{{"id", j.id()},
              {"name", j.spec().name()},
              {"kind", KindName(j.spec().kind())},
              {"state", JobStateName(j.state())},
              {"reason", j.reason()},
              {"step", j.step()},
              {"total_steps", j.total_steps()},
              {"workers", j.worker_ids_size()},
              {"generation", j.generation()},
              {"created_at", Number(j.created_at())},
              {"started_at", Number(j.started_at())},
              {"finished_at", Number(j.finished_at())},
              {"loss", Number(m.loss())},
              {"reward", Number(m.reward_mean())},
              {"accuracy", Number(m.accuracy())},
              {"tokens_per_s", Number(m.tokens_per_s())},
              {"peak_memory_bytes", m.peak_memory_bytes()}};
}

json Metrics(const tandem::v1::StepMetrics& m) {
  json extra = json::object();
  for (const auto& [k, v] : m.extra()) extra[k] = Number(v);
  json phases = json::object();
  for (const auto& [k, v] : m.phase_seconds()) phases[k] = Number(v);
  return json{{"step", m.step()},
              {"loss", Number(m.loss())},
              {"reward", Number(m.reward_mean())},
              {"accuracy", Number(m.accuracy())},
              {"kl", Number(m.kl())},
              {"tokens_per_s", Number(m.tokens_per_s())},
              {"lr", Number(m.lr())},
              {"grad_norm", Number(m.grad_norm())},
              {"switch_seconds", Number(m.switch_seconds())},
              {"peak_memory_bytes", m.peak_memory_bytes()},
              {"wall_time", Number(m.wall_time())},
              {"phase_seconds", phases},
              {"extra", extra}};
}

// Text from workers may hold invalid UTF-8: replaced, never thrown.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::StatusOr<std::string> JobIdParam(const QueryParams& q) {
  const std::string id = q.Get("id");
  RETURN_IF_ERROR(CheckId("id", id));
  return id;
}

}  // namespace

HttpResponse JsonResponse(int status, const std::string& json_text) {
  return HttpResponse{status, "application/json", json_text, {{"Cache-Control", "no-store"}}};
}

HttpResponse JsonError(const absl::Status& status) {
  int code = 500;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      code = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = 403;
      break;
    case absl::StatusCode::kNotFound:
      code = 404;
      break;
    default:
      break;
  }
  return JsonResponse(code, Dump(json{{"error", std::string(status.message())}}));
}

HttpResponse DashboardApi::Cluster(const HttpRequest& request) const {
  auto q = QueryParams::Parse(request.query, {});
  if (!q.ok()) return JsonError(q.status());
  const double now = clock_->WallSeconds();
  json workers = json::array();
  for (const auto& w : membership_->List()) {
    const auto in_use = timeline_->MemoryInUse(w.id());
    workers.push_back(json{{"id", w.id()},
                           {"name", w.name()},
                           {"host", w.host()},
                           {"device", DeviceName(w.device())},
                           {"device_count", w.device_count()},
                           {"memory_bytes", w.memory_bytes()},
                           {"memory_in_use_bytes", in_use ? json(*in_use) : json(nullptr)},
                           {"state", WorkerStateName(w.state())},
                           {"job_id", w.job_id()},
                           {"rank", w.job_id().empty() ? json(nullptr) : json(w.rank())},
                           {"preempting", w.preempting()},
                           {"version", w.version()},
                           {"last_heartbeat", Number(w.last_heartbeat())}});
  }
  std::map<std::string, int> by_state;
  for (const auto& j : jobs_->Snapshot()) by_state[JobStateName(j.state())]++;
  return JsonResponse(200, Dump(json{{"time", now}, {"workers", workers}, {"jobs_by_state", by_state}}));
}

HttpResponse DashboardApi::Jobs(const HttpRequest& request) const {
  auto q = QueryParams::Parse(request.query, {"limit"});
  if (!q.ok()) return JsonError(q.status());
  auto limit = q->GetInt("limit", 1, kMaxJobs, 100);
  if (!limit.ok()) return JsonError(limit.status());
  json jobs = json::array();
  for (const auto& j : jobs_->List(tandem::v1::JOB_STATE_UNSPECIFIED, static_cast<int>(*limit))) {
    jobs.push_back(JobSummary(j));
  }
  return JsonResponse(200, Dump(json{{"time", clock_->WallSeconds()}, {"jobs", jobs}}));
}

HttpResponse DashboardApi::Job(const HttpRequest& request) const {
  auto q = QueryParams::Parse(request.query, {"id", "window"});
  if (!q.ok()) return JsonError(q.status());
  auto id = JobIdParam(*q);
  if (!id.ok()) return JsonError(id.status());
  auto window = q->GetInt("window", 1, kMaxWindowSeconds, 600);
  if (!window.ok()) return JsonError(window.status());
  auto job = jobs_->Get(*id);
  if (!job.ok()) return JsonError(job.status());
  auto checkpoints = jobs_->Checkpoints(*id);
  if (!checkpoints.ok()) return JsonError(checkpoints.status());
  const double now = clock_->WallSeconds();

  json out = JobSummary(*job);
  // Members by rank, with names: the timeline's rows.
  std::map<std::string, std::string> names;
  for (const auto& w : membership_->List()) names[w.id()] = w.name();
  json members = json::array();
  for (int rank = 0; rank < job->worker_ids_size(); ++rank) {
    const std::string& wid = job->worker_ids(rank);
    members.push_back(json{{"id", wid}, {"name", names.count(wid) ? names[wid] : wid}, {"rank", rank}});
  }
  out["members"] = members;
  out["output_dir"] = job->output_dir();
  const auto& rec = job->recovery();
  out["recovery"] = json{{"recoveries", rec.recoveries()},
                         {"in_progress_since", rec.started_at() > 0 ? json(rec.started_at()) : json(nullptr)},
                         {"reason", rec.reason()},
                         {"steps_redone_total", rec.steps_redone_total()},
                         {"degraded_logical_world", rec.degraded_logical_world()},
                         {"grow_backs", rec.grow_backs()}};
  json cps = json::array();
  for (const auto& c : *checkpoints) {
    cps.push_back(json{{"step", c.step()},
                       {"path", c.path()},
                       {"generation", c.generation()},
                       {"world_size", c.world_size()},
                       {"bytes", c.bytes()},
                       {"time", Number(c.time())}});
  }
  out["checkpoints"] = cps;
  json spans = json::array();
  for (const auto& s : timeline_->Spans(*id, now - static_cast<double>(*window))) {
    spans.push_back(json{{"worker", s.worker_id},
                         {"phase", PhaseName(s.phase)},
                         {"step", s.step},
                         {"generation", s.generation},
                         {"start", s.start},
                         {"end", s.end > 0 ? json(s.end) : json(nullptr)},
                         {"ok", s.ok},
                         {"peak_memory_bytes", s.peak_memory_bytes}});
  }
  out["spans"] = spans;
  return JsonResponse(200, Dump(json{{"time", now}, {"job", out}}));
}

HttpResponse DashboardApi::Events(const HttpRequest& request) const {
  auto q = QueryParams::Parse(request.query, {"id", "after"});
  if (!q.ok()) return JsonError(q.status());
  auto id = JobIdParam(*q);
  if (!id.ok()) return JsonError(id.status());
  auto after = q->GetInt("after", 0, INT64_MAX, 0);
  if (!after.ok()) return JsonError(after.status());
  std::vector<StoredEvent> events;
  bool finished = false;
  if (absl::Status st = jobs_->NextEvents(*id, *after, 0, &events, &finished); !st.ok()) return JsonError(st);
  json list = json::array();
  int64_t next = *after;
  for (const auto& e : events) {
    json item{{"seq", e.seq},
              {"time", Number(e.event.time())},
              {"kind", e.event.kind()},
              {"message", e.event.message()},
              {"state", JobStateName(e.event.state())}};
    if (e.event.has_metrics()) item["metrics"] = Metrics(e.event.metrics());
    list.push_back(std::move(item));
    next = std::max(next, e.seq);
  }
  return JsonResponse(200, Dump(json{{"events", list}, {"next", next}, {"finished", finished}}));
}

}  // namespace tandem::server
