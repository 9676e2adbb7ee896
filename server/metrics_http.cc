#include "server/metrics_http.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/phase_plan.h"

namespace tandem::server {
namespace {

std::string Label(const std::string& v) {
  return absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

std::string WorkerStateName(tandem::v1::WorkerState s) {
  std::string n = tandem::v1::WorkerState_Name(s);
  if (n.rfind("WORKER_STATE_", 0) == 0) n = n.substr(13);
  return absl::AsciiStrToLower(n);
}

}  // namespace

std::string RenderMetrics(const std::vector<tandem::v1::Job>& jobs,
                          const std::map<tandem::v1::WorkerState, int>& workers) {
  std::string out;
  absl::StrAppend(&out, "# HELP tandem_jobs Jobs by state.\n# TYPE tandem_jobs gauge\n");
  std::map<tandem::v1::JobState, int> by_state;
  for (const auto& j : jobs) by_state[j.state()]++;
  for (int s = tandem::v1::JOB_STATE_PENDING; s <= tandem::v1::JOB_STATE_CANCELLED; ++s) {
    auto state = static_cast<tandem::v1::JobState>(s);
    absl::StrAppend(&out, "tandem_jobs{state=\"", JobStateName(state), "\"} ", by_state[state], "\n");
  }
  absl::StrAppend(&out, "# HELP tandem_workers Workers by state.\n# TYPE tandem_workers gauge\n");
  for (int s = tandem::v1::WORKER_STATE_IDLE; s <= tandem::v1::WORKER_STATE_GONE; ++s) {
    auto state = static_cast<tandem::v1::WorkerState>(s);
    auto it = workers.find(state);
    absl::StrAppend(&out, "tandem_workers{state=\"", WorkerStateName(state), "\"} ",
                    it == workers.end() ? 0 : it->second, "\n");
  }
  struct Family {
    const char* name;
    const char* help;
    std::function<double(const tandem::v1::Job&)> value;
  };
  std::vector<Family> families = {
      {"tandem_job_step", "Last completed step of a running job.", [](const auto& j) { return double(j.step()); }},
      {"tandem_job_total_steps", "Steps of a running job.", [](const auto& j) { return double(j.total_steps()); }},
      {"tandem_job_loss", "Loss of the last step.", [](const auto& j) { return j.latest().loss(); }},
      {"tandem_job_reward", "Mean reward of the last step.", [](const auto& j) { return j.latest().reward_mean(); }},
      {"tandem_job_accuracy", "Held-out accuracy at the last evaluation.",
       [](const auto& j) { return j.latest().accuracy(); }},
      {"tandem_job_tokens_per_second", "Throughput of the last step.",
       [](const auto& j) { return j.latest().tokens_per_s(); }},
      {"tandem_job_peak_memory_bytes", "Peak memory over ranks in the last step.",
       [](const auto& j) { return double(j.latest().peak_memory_bytes()); }},
  };
  std::vector<const tandem::v1::Job*> active;
  for (const auto& j : jobs) {
    if (j.state() == tandem::v1::JOB_STATE_RUNNING || j.state() == tandem::v1::JOB_STATE_RECOVERING) {
      active.push_back(&j);
    }
  }
  for (const auto& f : families) {
    absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name, " gauge\n");
    for (const auto* j : active) {
      absl::StrAppend(&out, f.name, "{job=\"", Label(j->id()), "\",name=\"", Label(j->spec().name()), "\"} ",
                      absl::StrFormat("%.17g", f.value(*j)), "\n");
    }
  }
  absl::StrAppend(&out, "# HELP tandem_job_phase_seconds Wall time of each phase in the last step.\n",
                  "# TYPE tandem_job_phase_seconds gauge\n");
  for (const auto* j : active) {
    for (const auto& [phase, secs] : j->latest().phase_seconds()) {
      absl::StrAppend(&out, "tandem_job_phase_seconds{job=\"", Label(j->id()), "\",phase=\"", Label(phase), "\"} ",
                      absl::StrFormat("%.17g", secs), "\n");
    }
  }
  return out;
}

MetricsServer::MetricsServer() = default;
MetricsServer::~MetricsServer() { Stop(); }

absl::Status MetricsServer::Start(const std::string& listen, std::function<std::string()> metrics,
                                  std::function<bool()> ready, HttpServerOptions options,
                                  std::function<void(HttpServer*)> add_routes) {
  auto colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_listen: '", listen, "' must be host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  server_ = std::make_unique<HttpServer>(options);
  server_->Get("/metrics", [metrics] { return HttpResponse{200, "text/plain; version=0.0.4", metrics()}; });
  server_->Get("/healthz", [] { return HttpResponse{200, "text/plain", "ok\n"}; });
  server_->Get("/readyz", [ready] {
    const bool ok = ready();
    return HttpResponse{ok ? 200 : 503, "text/plain", ok ? "ready\n" : "not ready\n"};
  });
  if (add_routes) add_routes(server_.get());
  if (absl::Status st = server_->Start(host, port); !st.ok()) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", listen, ": ", st.message()));
  }
  port_ = server_->port();
  return absl::OkStatus();
}

void MetricsServer::Stop() {
  if (server_) server_->Stop();
}

}  // namespace tandem::server
