// tandemctl submit, validate, jobs, status, cancel, checkpoints.
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_file.h"
#include "worker/model/job_model.h"

namespace tandem::cli {
namespace v1 = tandem::v1;
namespace {

int SpecError(const absl::Status& st) {
  std::cerr << "tandemctl: invalid job: " << st.message() << "\n";
  return st.code() == absl::StatusCode::kNotFound ? kExitUsage : kExitUsage;
}

std::string Age(double t) {
  if (t <= 0) return "-";
  return FormatDuration(NowUnix() - t) + " ago";
}

}  // namespace

int CmdSubmit(const Args& args) {
  const std::string usage =
      "Usage: tandemctl submit JOB.yaml [--set key.path=value ...] [--workers N] [--resume-from PATH]\n"
      "Validates the job file (same rules as the coordinator) and submits it; prints the job id.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {{"set", "workers", "resume-from"}, {}, {}}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: submit needs exactly one job file\n\n" << usage;
    return kExitUsage;
  }
  auto spec = LoadJobForCli(p->positional[0], *p);
  if (!spec.ok()) return SpecError(spec.status());
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = *spec;
  v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().SubmitJob(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("submit", s, client->options());
  if (client->options().json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    std::cout << resp.job_id() << "\n";
    std::cerr << "submitted " << spec->name() << " as job " << resp.job_id() << " (tandemctl watch " << resp.job_id()
              << ")\n";
  }
  return kExitOk;
}

int CmdValidate(const Args& args) {
  const std::string usage =
      "Usage: tandemctl validate JOB.yaml [--set key.path=value ...] [--workers N]\n"
      "Checks a job file with the coordinator's rules, without contacting it; prints the\n"
      "normalized job (every key, defaults filled in) and the memory estimate per worker\n"
      "that submission compares with the workers' memory.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {{"set", "workers", "resume-from"}, {}, {}}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: validate needs exactly one job file\n\n" << usage;
    return kExitUsage;
  }
  auto spec = LoadJobForCli(p->positional[0], *p);
  if (!spec.ok()) return SpecError(spec.status());
  if (p->Get("output") == "json") {
    std::cout << ToJson(*spec) << "\n";
  } else {
    std::cerr << p->positional[0] << ": ok (" << common::KindName(spec->kind()) << ", " << spec->cluster().workers()
              << " worker(s), " << spec->train().steps() << " steps)\n";
    // What SubmitJob compares with the workers' memory.
    if (auto config = model::JobModelConfig(*spec); config.ok()) {
      std::cerr << "estimated memory per worker: " << model::EstimateJobMemory(*spec, *config).Describe() << "\n";
    }
    std::cout << common::JobSpecToYaml(*spec);
  }
  return kExitOk;
}

int CmdJobs(const Args& args) {
  const std::string usage =
      "Usage: tandemctl jobs [--state pending|running|recovering|succeeded|failed|cancelled] [--limit N]\n";
  int code = 0;
  auto p = ParseOrUsage(args, {{"state", "limit"}, {}, {}}, usage, &code);
  if (!p) return code;
  v1::ListJobsRequest req;
  if (p->Has("state")) {
    v1::JobState st;
    if (!v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(p->Get("state")), &st)) {
      std::cerr << "tandemctl: --state: unknown state '" << p->Get("state") << "'\n";
      return kExitUsage;
    }
    req.set_state(st);
  }
  if (p->Has("limit")) {
    auto n = ParseInt("--limit", p->Get("limit"), 1, 100000);
    if (!n.ok()) {
      std::cerr << "tandemctl: " << n.status().message() << "\n";
      return kExitUsage;
    }
    req.set_limit(static_cast<int>(*n));
  }
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().ListJobs(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("jobs", s, client->options());
  if (client->options().json) {
    for (const auto& j : resp.jobs()) std::cout << ToJson(j) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "KIND", "STATE", "STEP", "WORKERS", "CREATED", "REASON"}};
  for (const auto& j : resp.jobs()) {
    rows.push_back({j.id(), j.spec().name(), KindName(j.spec().kind()), StateName(j.state()),
                    absl::StrCat(j.step(), "/", j.total_steps()),
                    absl::StrCat(j.worker_ids_size(), "/", j.spec().cluster().workers()), Age(j.created_at()),
                    j.reason()});
  }
  std::cout << Table(rows);
  return kExitOk;
}

int CmdStatus(const Args& args) {
  const std::string usage = "Usage: tandemctl status JOB\nShows a job's state, progress and latest metrics.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: status needs a job id\n\n" << usage;
    return kExitUsage;
  }
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::GetJobRequest req;
  req.set_job_id(p->positional[0]);
  v1::Job job;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().GetJob(&ctx, req, &job);
  if (!s.ok()) return ReportRpcError("status", s, client->options());
  if (client->options().json) {
    std::cout << ToJson(job) << "\n";
    return kExitOk;
  }
  const auto& m = job.latest();
  std::cout << "job:        " << job.id() << " (" << job.spec().name() << ", " << KindName(job.spec().kind()) << ")\n"
            << "state:      " << StateName(job.state()) << (job.reason().empty() ? "" : "  (" + job.reason() + ")")
            << "\n"
            << "progress:   " << job.step() << "/" << job.total_steps() << "\n"
            << "workers:    " << job.worker_ids_size() << "/" << job.spec().cluster().workers() << " ("
            << common::DeviceName(job.spec().cluster().device()) << ")";
  for (const auto& w : job.worker_ids()) std::cout << " " << w;
  std::cout << "\n";
  if (job.generation() > 0) std::cout << "generation: " << job.generation() << "\n";
  const auto& rec = job.recovery();
  if (rec.degraded_logical_world() > 0) {
    std::cout << "degraded:   " << job.worker_ids_size() << " rank(s) compute " << rec.degraded_logical_world()
              << " data shares since step " << rec.degraded_since_step() << "; grows back when a worker is idle\n";
  }
  if (rec.recoveries() > 0) {
    std::cout << "recoveries: " << rec.recoveries() << " (" << rec.steps_redone_total() << " steps redone"
              << (rec.grow_backs() > 0 ? absl::StrCat(", ", rec.grow_backs(), " grow-back(s)") : "") << ")\n";
  }
  if (job.started_at() > 0) {
    const double end = job.finished_at() > 0 ? job.finished_at() : NowUnix();
    std::cout << "elapsed:    " << FormatDuration(end - job.started_at()) << "\n";
  }
  if (!job.output_dir().empty() || !job.spec().output_dir().empty()) {
    std::cout << "output:     " << (job.output_dir().empty() ? job.spec().output_dir() : job.output_dir()) << "\n";
  }
  if (m.step() != 0 || m.loss() != 0 || m.reward_mean() != 0) {
    std::cout << "latest:     " << ProgressLine(job, m, NowUnix()) << "\n";
    if (m.peak_memory_bytes() > 0) std::cout << "peak mem:   " << FormatBytes(m.peak_memory_bytes()) << "\n";
    if (!m.phase_seconds().empty()) {
      std::cout << "phases (s):";
      for (const auto& [k, v] : m.phase_seconds()) std::cout << " " << k << "=" << absl::StrCat(v);
      std::cout << "\n";
    }
  }
  return kExitOk;
}

int CmdCancel(const Args& args) {
  const std::string usage = "Usage: tandemctl cancel JOB [--reason TEXT]\n";
  int code = 0;
  auto p = ParseOrUsage(args, {{"reason"}, {}, {}}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: cancel needs a job id\n\n" << usage;
    return kExitUsage;
  }
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::CancelJobRequest req;
  req.set_job_id(p->positional[0]);
  req.set_reason(p->Get("reason", "cancelled with tandemctl"));
  v1::CancelJobResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().CancelJob(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("cancel", s, client->options());
  if (client->options().json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    std::cout << "job " << resp.job().id() << ": " << StateName(resp.job().state()) << "\n";
  }
  return kExitOk;
}

int CmdCheckpoints(const Args& args) {
  const std::string usage =
      "Usage: tandemctl checkpoints JOB\nLists the checkpoints recorded for a job. SIZE is the checkpoint on disk:\n"
      "every rank's shard file plus its manifest.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: checkpoints needs a job id\n\n" << usage;
    return kExitUsage;
  }
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::ListCheckpointsRequest req;
  req.set_job_id(p->positional[0]);
  v1::ListCheckpointsResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().ListCheckpoints(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("checkpoints", s, client->options());
  if (client->options().json) {
    for (const auto& c : resp.checkpoints()) std::cout << ToJson(c) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"STEP", "GEN", "WORLD", "SIZE", "WRITTEN", "PATH"}};
  for (const auto& c : resp.checkpoints()) {
    rows.push_back({absl::StrCat(c.step()), absl::StrCat(c.generation()), absl::StrCat(c.world_size()),
                    FormatBytes(c.bytes()), Age(c.time()), c.path()});
  }
  std::cout << Table(rows);
  return kExitOk;
}

}  // namespace tandem::cli
