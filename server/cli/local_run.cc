// tandemctl run --local: the embedded default. Starts tandem-coordinator and
// N tandem-worker processes on 127.0.0.1 (ephemeral ports, fresh tokens in
// 0600 files), submits the job, shows progress, writes DIR/metrics.jsonl and
// DIR/summary.json, leaves the model in DIR/final/, and stops every child on
// success, failure and Ctrl-C (see child_process.h for the no-orphan rules).
// Workers that fail during the job are restarted (worker_supervisor.h);
// restarts and the job's state/recovery events go to DIR/events.jsonl.
// The processes live in local_cluster.h, the run's reports in
// local_run_report.h; this file is the command: checks, run directory,
// start-up, submission and following the job.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_file.h"
#include "server/cli/job_follow.h"
#include "server/cli/local_cluster.h"
#include "server/cli/local_run_report.h"
#include "server/cli/signal_watch.h"
#include "server/cli/worker_supervisor.h"
#include "worker/model/job_model.h"

namespace tandem::cli {
namespace v1 = tandem::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

int ExitCodeForJob(const v1::Job& job);  // cmd_watch.cc

namespace {

constexpr auto kRegisterTimeout = std::chrono::seconds(90);

std::string Timestamp() {
  const time_t t = time(nullptr);
  struct tm tm_buf;
  localtime_r(&t, &tm_buf);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm_buf);
  return buf;
}

}  // namespace

// The local workers' --device: the job's device, or cpu-guarded when asked
// for a cpu job; "" for any other request.
std::string WorkerDevice(const v1::JobSpec& spec, const ParsedArgs& p) {
  const std::string device = spec.cluster().device() == v1::DEVICE_KIND_CUDA ? "cuda" : "cpu";
  if (!p.Has("worker-device") || p.Get("worker-device") == device) return device;
  return p.Get("worker-device") == "cpu-guarded" && device == "cpu" ? "cpu-guarded" : "";
}

int CmdRunLocal(const Args& args) {
  const std::string usage =
      "Usage: tandemctl run --local [--workers N] [--nodes K] [--run-dir DIR] [--no-restart] JOB.yaml\n"
      "                            [--set key.path=value ...]\n"
      "Runs one job on this machine: starts tandem-coordinator and N tandem-worker processes on\n"
      "127.0.0.1 (ephemeral ports, fresh tokens), submits the job, shows progress, prints a summary\n"
      "and stops every process it started (also on failure and Ctrl-C).\n"
      "  --workers N     workers to start (default: the job's cluster.workers)\n"
      "  --nodes K       declare the workers on K emulated nodes, node by node (tandem-worker --node\n"
      "                  local-node0..K-1; worker i on node i*K/N), so node-aware options such as\n"
      "                  zero.hierarchical_partition run on one machine (default 1: one node)\n"
      "  --run-dir DIR   where logs, state, metrics.jsonl and final/ go (default runs/<job>-<time>)\n"
      "  --resume-from P start from a checkpoint\n"
      "  --no-restart    do not restart a worker that fails during the job (by default one that\n"
      "                  exits non-zero or is killed by a signal is restarted with the same name,\n"
      "                  after 0.5 s doubling to 4 s, at most 5 times per worker; the job then\n"
      "                  recovers from its newest checkpoint; see DIR/events.jsonl)\n"
      "  --worker-device cpu-guarded\n"
      "                  debugging: a cpu job's workers run the GPU code path on the CPU with\n"
      "                  every buffer in memory the host cannot touch (docs/gpu.md)\n"
      "Programs are found next to tandemctl or on PATH (override: TANDEM_COORDINATOR_BIN,\n"
      "TANDEM_WORKER_BIN). Exit: 0 succeeded, 1 failed, 2 invalid job, 3 cancelled/interrupted.\n";
  int code = 0;
  auto p = ParseOrUsage(
      args, {{"set", "workers", "nodes", "run-dir", "resume-from", "worker-device"}, {"local", "no-restart"}, {}},
      usage, &code);
  if (!p) return code;
  if (!p->Has("local")) {
    std::cerr << "tandemctl: run needs --local (the only mode; use submit for a cluster)\n\n" << usage;
    return kExitUsage;
  }
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: run --local needs exactly one job file\n\n" << usage;
    return kExitUsage;
  }
  auto spec = LoadJobForCli(p->positional[0], *p);
  if (!spec.ok()) {
    std::cerr << "tandemctl: invalid job: " << spec.status().message() << "\n";
    return kExitUsage;
  }
  if (const std::string d = WorkerDevice(*spec, *p); d.empty()) {
    std::cerr << "tandemctl: --worker-device: expected cpu-guarded, for a job with cluster.device: cpu; got '"
              << p->Get("worker-device") << "'\n";
    return kExitUsage;
  }
  int nodes = 1;
  if (p->Has("nodes")) {
    auto k = ParseInt("--nodes", p->Get("nodes"), 1, spec->cluster().workers());
    if (!k.ok()) {
      std::cerr << "tandemctl: " << k.status().message() << " (1 to the number of workers)\n";
      return kExitUsage;
    }
    nodes = static_cast<int>(*k);
  }
  const bool json = p->Get("output") == "json";
  auto coordinator_bin = FindProgram("tandem-coordinator", "TANDEM_COORDINATOR_BIN");
  auto worker_bin = FindProgram("tandem-worker", "TANDEM_WORKER_BIN");
  for (const auto* r : {&coordinator_bin, &worker_bin}) {
    if (!r->ok()) {
      std::cerr << "tandemctl: " << r->status().message() << "\n";
      return kExitFailed;
    }
  }
  // Run directory, tokens, final spec.
  std::error_code ec;
  fs::path dir =
      p->Has("run-dir") ? fs::path(p->Get("run-dir")) : fs::path("runs") / absl::StrCat(spec->name(), "-", Timestamp());
  fs::create_directories(dir, ec);
  dir = fs::absolute(dir, ec).lexically_normal();
  if (ec || !fs::is_directory(dir)) {
    std::cerr << "tandemctl: cannot create run directory " << dir.string() << "\n";
    return kExitFailed;
  }
  spec->set_output_dir((dir / "final").string());
  if (spec->checkpoint().dir().empty()) spec->mutable_checkpoint()->set_dir((dir / "checkpoints").string());
  if (absl::Status st = common::ValidateJobSpec(*spec); !st.ok() || !(st = model::CheckJobForWorkers(*spec)).ok()) {
    std::cerr << "tandemctl: invalid job: " << st.message() << "\n";
    return kExitUsage;
  }
  auto admin = RandomToken();
  auto join = RandomToken();
  if (!admin.ok() || !join.ok()) {
    std::cerr << "tandemctl: " << admin.status().message() << "\n";
    return kExitFailed;
  }
  for (const auto& [file, token] : {std::pair{"admin.token", *admin}, std::pair{"join.token", *join}}) {
    if (absl::Status st = WritePrivateFile(dir / file, token + "\n"); !st.ok()) {
      std::cerr << "tandemctl: " << st.message() << "\n";
      return kExitFailed;
    }
  }
  std::ofstream(dir / "job.yaml") << common::JobSpecToYaml(*spec);
  const int workers = spec->cluster().workers();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads =
      spec->cluster().threads_per_worker() > 0 ? spec->cluster().threads_per_worker() : std::max(1, cores / workers);
  const std::string device = WorkerDevice(*spec, *p);

  Canceller cancel;
  std::atomic<bool> interrupted{false};
  SignalWatcher signals([&](int) {
    interrupted.store(true);
    cancel.Cancel();
  });
  const auto t0 = std::chrono::steady_clock::now();
  ProgressPrinter progress;
  RunEvents events(dir / "events.jsonl", &progress, json);
  // Declared after `events`: the cluster (and its supervisor thread, which
  // reports to `events`) is stopped first.
  LocalCluster cluster;
  auto fail = [&](const std::string& msg, int exit_code) {
    std::cerr << "\ntandemctl: " << msg << "\n";
    if (!json) std::cerr << "tandemctl: stopping the local processes (logs in " << dir.string() << ")\n";
    cluster.Shutdown();
    return exit_code;
  };
  auto interrupted_exit = [&] { return fail("interrupted", kExitCancelled); };
  if (absl::Status st = cluster.StartCoordinator(*coordinator_bin, dir, &cancel); !st.ok()) {
    return interrupted.load() ? interrupted_exit() : fail(std::string(st.message()), kExitFailed);
  }
  SupervisorOptions restart;
  restart.restart = !p->Has("no-restart");
  restart.stop_grace = kLocalStopGrace;
  if (absl::Status st = cluster.StartWorkers(*worker_bin, dir, workers, nodes, device, threads, restart,
                                             [&events](const SupervisorEvent& e) { events.Supervisor(e); });
      !st.ok()) {
    return fail(std::string(st.message()), kExitFailed);
  }
  if (!json) {
    std::cerr << "tandemctl: coordinator at " << cluster.grpc_address() << " (metrics http://"
              << cluster.metrics_address() << "/metrics), " << workers << " " << device << " worker(s) x " << threads
              << " thread(s)" << (nodes > 1 ? absl::StrCat(" on ", nodes, " nodes") : "") << "; run dir "
              << dir.string() << "\n"
              << "tandemctl: dashboard http://" << cluster.metrics_address() << "/dashboard/ (log in with "
              << (dir / "admin.token").string() << ")\n";
  }
  // gRPC from here on; restarts fork on the supervisor thread (safe with
  // gRPC running: child_process.h).
  ClientOptions options;
  options.coordinator = cluster.grpc_address();
  options.token = *admin;
  ControlClient client(options);
  cluster.StartMonitor(&cancel);

  // Wait for every worker to register.
  const auto reg_until = std::chrono::steady_clock::now() + kRegisterTimeout;
  while (true) {
    if (cancel.cancelled()) {
      return cluster.coordinator_died() && !interrupted.load()
                 ? fail("tandem-coordinator exited; its log:\n" + TailOfFile(cluster.log(), 20), kExitFailed)
                 : interrupted_exit();
    }
    if (auto down = cluster.FirstDownWorker()) {
      return fail(absl::StrCat("worker ", down->member, " exited during start-up (", down->reason, "); its log:\n",
                               TailOfFile(down->log_file, 20)),
                  kExitFailed);
    }
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    client.Prepare(&ctx, milliseconds(2000));
    int idle = 0;
    if (client.stub().ListWorkers(&ctx, v1::ListWorkersRequest(), &resp).ok()) {
      for (const auto& w : resp.workers()) idle += w.state() == v1::WORKER_STATE_IDLE;
    }
    if (idle >= workers) {
      // From now on a failed worker is restarted; one that died a moment
      // before still counts as a start-up failure (reported at the top).
      cluster.AllowRestarts();
      if (!cluster.FirstDownWorker()) break;
      continue;
    }
    if (std::chrono::steady_clock::now() > reg_until) {
      return fail(absl::StrCat("only ", idle, " of ", workers, " workers registered within ", kRegisterTimeout.count(),
                               " s; see ", dir.string(), "/worker-*.log"),
                  kExitFailed);
    }
    std::this_thread::sleep_for(milliseconds(100));
  }

  v1::SubmitJobRequest sreq;
  *sreq.mutable_spec() = *spec;
  v1::SubmitJobResponse sresp;
  {
    grpc::ClientContext ctx;
    client.Prepare(&ctx);
    grpc::Status s = client.stub().SubmitJob(&ctx, sreq, &sresp);
    if (!s.ok()) {
      cluster.Shutdown();
      return ReportRpcError("submit", s, client.options());
    }
  }
  if (!json) std::cerr << "tandemctl: job " << sresp.job_id() << " (" << spec->name() << ") submitted\n";

  std::map<int64_t, v1::StepMetrics> steps;
  std::ofstream metrics(dir / "metrics.jsonl", std::ios::trunc);
  TensorBoardScalars tensorboard(dir);
  v1::Job final_job;
  grpc::Status s = FollowJob(
      client, sresp.job_id(), /*from_start=*/true,
      [&](const v1::Job& job, const v1::JobEvent& ev) {
        if (ev.kind() == "step" && ev.has_metrics()) {
          const int64_t step = ev.metrics().step();
          const bool is_new = steps.count(step) == 0;
          MergeStep(&steps[step], ev.metrics());
          if (is_new) metrics << StepJson(ev.metrics()).dump() << "\n" << std::flush;
          tensorboard.Record(StepJson(steps[step]));
          if (!json) progress.Step(job, steps[step]);
        } else if (ev.kind() == "state" || ev.kind() == "recovery" || ev.kind() == "worker" ||
                   ev.kind() == "warm_start") {
          events.Job(ev);
        }
      },
      &cancel, &final_job, std::chrono::seconds(30));
  progress.Finish();
  metrics.close();
  // Rewrite the file with each step's merged figures (one object per step, in order).
  {
    std::ofstream out(dir / "metrics.jsonl.tmp", std::ios::trunc);
    for (const auto& [step, m] : steps) out << StepJson(m).dump() << "\n";
    out.close();
    fs::rename(dir / "metrics.jsonl.tmp", dir / "metrics.jsonl", ec);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) {
    if (interrupted.load()) return interrupted_exit();
    if (cluster.coordinator_died()) {
      return fail("tandem-coordinator exited during the job; its log:\n" + TailOfFile(cluster.log(), 20), kExitFailed);
    }
    const int rc = ReportRpcError("watch", s, client.options());
    cluster.Shutdown();
    return rc;
  }
  if (final_job.state() != v1::JOB_STATE_SUCCEEDED && !json) {
    // Show the job's last log lines: the reason in context.
    v1::GetJobLogsRequest lreq;
    lreq.set_job_id(final_job.id());
    lreq.set_limit(1000);
    v1::GetJobLogsResponse lresp;
    grpc::ClientContext ctx;
    client.Prepare(&ctx);
    if (client.stub().GetJobLogs(&ctx, lreq, &lresp).ok() && lresp.lines_size() > 0) {
      std::cerr << "last log lines:\n";
      for (int i = std::max(0, lresp.lines_size() - 15); i < lresp.lines_size(); ++i) {
        std::cerr << "    " << lresp.lines(i).source() << ": " << lresp.lines(i).text() << "\n";
      }
    }
  }
  cluster.Shutdown();
  PrintSummary(final_job, steps, dir, wall, cluster.restarts(), cluster.down_workers(), json);
  return ExitCodeForJob(final_job);
}

}  // namespace tandem::cli