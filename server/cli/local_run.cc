// tandemctl run --local: the embedded default. Starts tandem-coordinator and
// N tandem-worker processes on 127.0.0.1 (ephemeral ports, fresh tokens in
// 0600 files), submits the job, shows progress, writes DIR/metrics.jsonl and
// DIR/summary.json, leaves the model in DIR/final/, and stops every child on
// success, failure and Ctrl-C (see child_process.h for the no-orphan rules).
// Workers that fail during the job are restarted (worker_supervisor.h);
// restarts and the job's state/recovery events go to DIR/events.jsonl.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "worker/model/job_model.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "nlohmann/json.hpp"
#include "server/cli/child_process.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_file.h"
#include "server/cli/job_follow.h"
#include "server/cli/signal_watch.h"
#include "server/cli/tensorboard_log.h"
#include "server/cli/worker_supervisor.h"

namespace tandem::cli {
namespace v1 = tandem::v1;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

int ExitCodeForJob(const v1::Job& job);  // cmd_watch.cc

namespace {

constexpr auto kReadyTimeout = std::chrono::seconds(60);
constexpr auto kRegisterTimeout = std::chrono::seconds(90);
constexpr auto kStopGrace = milliseconds(15000);

absl::StatusOr<std::string> RandomToken() {
  unsigned char buf[32];
  FILE* f = fopen("/dev/urandom", "rb");
  if (f == nullptr || fread(buf, 1, sizeof(buf), f) != sizeof(buf)) {
    if (f != nullptr) fclose(f);
    return absl::InternalError("cannot read /dev/urandom");
  }
  fclose(f);
  std::string hex;
  for (unsigned char c : buf) absl::StrAppend(&hex, absl::StrFormat("%02x", c));
  return hex;
}

absl::Status WritePrivateFile(const fs::path& path, const std::string& content) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  fchmod(fd, 0600);
  const bool ok = write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  close(fd);
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path.string()));
}

std::string TailOfFile(const fs::path& path, size_t max_lines) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > max_lines) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) absl::StrAppend(&out, "    ", l, "\n");
  return out;
}

std::string Timestamp() {
  const time_t t = time(nullptr);
  struct tm tm_buf;
  localtime_r(&t, &tm_buf);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm_buf);
  return buf;
}

// Everything the local run started; the destructor stops it all. The
// calling (main) thread starts and stops the coordinator; the workers belong
// to the WorkerSupervisor and its thread; the monitor thread only watches
// the coordinator.
class LocalCluster {
 public:
  ~LocalCluster() { Shutdown(); }

  void Shutdown() {
    monitor_stop_.store(true);
    if (monitor_.joinable()) monitor_.join();
    // Workers first get their stop signal with the coordinator still up
    // (they report and leave), then the coordinator. Supervision ends before.
    if (supervisor_) supervisor_->Stop();
    if (coordinator_) StopAll({coordinator_.get()}, kStopGrace);
    if (drain_.joinable()) drain_.join();  // the pipe is at EOF now
    coordinator_.reset();
  }

  // Starts the coordinator and waits for its ready line.
  absl::Status StartCoordinator(const std::string& program, const fs::path& dir, Canceller* cancel) {
    log_ = dir / "coordinator.log";
    ChildSpec spec;
    spec.path = program;
    spec.args = {"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                 "--state-dir", (dir / "state").string(),
                 "--admin-token-file", (dir / "admin.token").string(),
                 "--join-token-file", (dir / "join.token").string()};
    spec.log_file = log_.string();
    spec.pipe_stdout = true;
    auto child = ChildProcess::Start(spec);
    if (!child.ok()) return child.status();
    coordinator_ = std::move(*child);
    // Read stdout until the ready line.
    const int fd = coordinator_->stdout_fd();
    std::string buf;
    const auto until = std::chrono::steady_clock::now() + kReadyTimeout;
    while (true) {
      if (cancel->cancelled()) return absl::CancelledError("interrupted");
      const auto left = std::chrono::duration_cast<milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return absl::DeadlineExceededError(absl::StrCat("tandem-coordinator printed no ready line within ",
                                                        kReadyTimeout.count(), " s; its log:\n", TailOfFile(log_, 20)));
      }
      pollfd p{fd, POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
      if (r < 0 && errno != EINTR) return absl::InternalError("poll failed");
      if (r <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n <= 0) {
        return absl::UnavailableError(absl::StrCat("tandem-coordinator exited before it was ready (",
                                                   coordinator_->ExitText(), "); its log:\n", TailOfFile(log_, 20)));
      }
      buf.append(chunk, n);
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        const std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        AppendLog(line);
        if (line.rfind("tandem-coordinator listening", 0) != 0) continue;
        for (absl::string_view field : absl::StrSplit(line, ' ')) {
          if (absl::ConsumePrefix(&field, "grpc=")) grpc_address_ = std::string(field);
          if (absl::ConsumePrefix(&field, "metrics=")) metrics_address_ = std::string(field);
        }
        if (grpc_address_.empty()) return absl::InternalError("ready line without grpc=ADDRESS: " + line);
        // Keep draining stdout into the log so the coordinator never blocks on it.
        drain_ = std::thread([this, fd] {
          char chunk2[4096];
          ssize_t m;
          while ((m = read(fd, chunk2, sizeof(chunk2))) > 0) AppendLog(std::string(chunk2, m));
        });
        return absl::OkStatus();
      }
    }
  }

  // Starts the workers on the supervisor's thread; on_event runs there.
  absl::Status StartWorkers(const std::string& program, const fs::path& dir, int n, const std::string& device,
                            int threads, const SupervisorOptions& options, WorkerSupervisor::EventFn on_event) {
    std::vector<SupervisedMember> members;
    for (int i = 0; i < n; ++i) {
      SupervisedMember m;
      m.name = absl::StrCat("local-", i);
      ChildSpec& spec = m.spec;
      spec.path = program;
      spec.args = {"--coordinator", grpc_address_, "--name", m.name,
                   "--device", device, "--data-address", "127.0.0.1",
                   "--token-file", (dir / "join.token").string(), "--threads", absl::StrCat(threads)};
      // One worker per GPU: local worker i computes on GPU i.
      if (device == "cuda") spec.args.insert(spec.args.end(), {"--device-index", absl::StrCat(i)});
      spec.log_file = (dir / absl::StrCat("worker-", i, ".log")).string();
      members.push_back(std::move(m));
    }
    supervisor_ = std::make_unique<WorkerSupervisor>(options, std::move(on_event));
    return supervisor_->Start(std::move(members));
  }

  // Cancels `cancel` when the coordinator dies.
  void StartMonitor(Canceller* cancel) {
    monitor_ = std::thread([this, cancel] {
      while (!monitor_stop_.load()) {
        if (!coordinator_->Running()) {
          coordinator_died_.store(true);
          cancel->Cancel();
          return;
        }
        std::this_thread::sleep_for(milliseconds(200));
      }
    });
  }

  // Once every worker has registered: a failure from now on is restarted.
  void AllowRestarts() { supervisor_->AllowRestarts(); }
  // A worker that exited and will not come back (start-up: every exit).
  std::optional<SupervisorEvent> FirstDownWorker() const {
    auto down = supervisor_->Down();
    if (down.empty()) return std::nullopt;
    return down.front();
  }
  std::vector<SupervisorEvent> restarts() const {
    return supervisor_ ? supervisor_->restarts() : std::vector<SupervisorEvent>{};
  }
  std::vector<SupervisorEvent> down_workers() const {
    return supervisor_ ? supervisor_->Down() : std::vector<SupervisorEvent>{};
  }

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  bool coordinator_died() const { return coordinator_died_.load(); }
  bool coordinator_running() { return coordinator_ && coordinator_->Running(); }
  const fs::path& log() const { return log_; }

 private:
  void AppendLog(const std::string& text) {
    std::ofstream out(log_, std::ios::app);
    out << text << (text.empty() || text.back() != '\n' ? "\n" : "");
  }

  std::unique_ptr<ChildProcess> coordinator_;
  std::unique_ptr<WorkerSupervisor> supervisor_;
  std::thread drain_;
  std::thread monitor_;
  std::atomic<bool> monitor_stop_{false};
  std::atomic<bool> coordinator_died_{false};
  std::string grpc_address_;
  std::string metrics_address_;
  fs::path log_;
};

// DIR/events.jsonl: one JSON object per line - the supervisor's exits and
// restarts (source "tandemctl") and the job's state, worker and recovery
// events (source "coordinator") - each also shown as a progress line (on
// stderr with --output json). Thread safe: the supervisor thread and the
// main thread both report.
class RunEvents {
 public:
  RunEvents(const fs::path& file, ProgressPrinter* progress, bool json)
      : out_(file, std::ios::trunc), progress_(progress), json_(json) {}

  void Supervisor(const SupervisorEvent& e) {
    using Kind = SupervisorEvent::Kind;
    nlohmann::json j;
    j["time"] = e.time;
    j["source"] = "tandemctl";
    j["kind"] = e.kind == Kind::kRestarted       ? "restart"
                : e.kind == Kind::kRestartFailed ? "restart_failed"
                : e.kind == Kind::kGaveUp        ? "restart_limit"
                                                 : "worker_exit";
    j["worker"] = e.member;
    j["reason"] = e.reason;
    if (e.kind != Kind::kExited) {
      j["restart"] = e.restart;
      j["max_restarts"] = e.max_restarts;
    }
    if (e.kind == Kind::kRestarted) j["pid"] = e.pid;
    if (!e.error.empty()) j["error"] = e.error;
    if (!e.note.empty()) j["note"] = e.note;
    const std::string text = DescribeEvent(e);
    j["message"] = text;
    Write(j, absl::StrCat(e.kind == Kind::kExited ? "[worker] " : "[restart] ", text), /*always=*/true);
  }

  void Job(const v1::JobEvent& ev) {
    nlohmann::json j;
    j["time"] = ev.time();
    j["source"] = "coordinator";
    j["kind"] = ev.kind();
    j["message"] = ev.message();
    if (ev.state() != v1::JOB_STATE_UNSPECIFIED) j["state"] = StateName(ev.state());
    Write(j, absl::StrCat("[", ev.kind(), "] ", ev.message()), /*always=*/false);
  }

 private:
  // `always`: shown on stderr with --output json too.
  void Write(const nlohmann::json& j, const std::string& line, bool always) {
    absl::MutexLock lock(&mu_);
    out_ << j.dump() << "\n" << std::flush;
    if (!json_) {
      progress_->Message(line);
    } else if (always) {
      std::cerr << "tandemctl: " << line << "\n";
    }
  }

  absl::Mutex mu_;
  std::ofstream out_ ABSL_GUARDED_BY(mu_);
  ProgressPrinter* const progress_;
  const bool json_;
};

// Why a worker that exited stays down, for the summary.
std::string WhyNotRestarted(const SupervisorEvent& e) {
  if (e.kind == SupervisorEvent::Kind::kGaveUp) return absl::StrCat("all ", e.max_restarts, " restarts used");
  if (e.note == "--no-restart") return "restarts are off (--no-restart)";
  return e.note;
}

// The run's TensorBoard event files (tensorboard_log.h); a file that cannot
// be written costs the TensorBoard view, never the run: one warning.
class TensorBoardScalars {
 public:
  explicit TensorBoardScalars(const fs::path& dir) {
    auto log = TensorBoardLog::Create(dir);
    if (log.ok()) {
      log_ = std::move(*log);
    } else {
      Warn(log.status());
    }
  }
  void Record(const nlohmann::json& step) {
    if (!log_) return;
    if (absl::Status st = log_->Record(step); !st.ok()) {
      Warn(st);
      log_.reset();
    }
  }

 private:
  static void Warn(const absl::Status& st) {
    std::cerr << "tandemctl: warning: no TensorBoard events for this run: " << st.message() << "\n";
  }
  std::unique_ptr<TensorBoardLog> log_;
};

// Merges a later report of the same step into an earlier one (EVAL adds accuracy).
void MergeStep(v1::StepMetrics* into, const v1::StepMetrics& from) {
  v1::StepMetrics merged = *into;
  merged.MergeFrom(from);  // proto3 scalars: non-zero values of `from` win
  *into = merged;
}

nlohmann::json StepJson(const v1::StepMetrics& m) {
  nlohmann::json j = nlohmann::json::parse(ToJson(m), nullptr, false);
  if (j.is_discarded()) return nlohmann::json::object();
  // Proto JSON writes int64 as strings; metrics.jsonl wants numbers.
  for (const char* key : {"step", "peak_memory_bytes"}) {
    if (j.contains(key) && j[key].is_string()) {
      try {
        j[key] = std::stoll(j[key].get<std::string>());
      } catch (...) {
      }
    }
  }
  return j;
}

void PrintSummary(const v1::Job& job, const std::map<int64_t, v1::StepMetrics>& steps, const fs::path& dir,
                  double wall_seconds, const std::vector<SupervisorEvent>& restarts,
                  const std::vector<SupervisorEvent>& down, bool json_output) {
  nlohmann::json s;
  s["job_id"] = job.id();
  s["name"] = job.spec().name();
  s["kind"] = common::KindName(job.spec().kind());
  s["state"] = StateName(job.state());
  s["reason"] = job.reason();
  s["steps"] = job.step();
  s["total_steps"] = job.total_steps();
  s["workers"] = job.spec().cluster().workers();
  s["wall_seconds"] = wall_seconds;
  double final_loss = 0, final_reward = 0, acc_before = -1, acc_after = -1, tokens = 0, switch_s = 0, phase_total = 0;
  int tok_n = 0;
  std::map<std::string, double> phases;
  bool has_reward = false;
  std::vector<double> rewards;  // RL steps in order, for the reward curve
  for (const auto& [step, m] : steps) {
    if (step > 0 && job.spec().kind() != v1::JOB_KIND_SFT) rewards.push_back(m.reward_mean());
    if (m.loss() != 0) final_loss = m.loss();
    if (step > 0 && job.spec().kind() != v1::JOB_KIND_SFT) {
      final_reward = m.reward_mean();
      has_reward = true;
    }
    const bool has_acc = m.accuracy() != 0 || m.extra().count("eval") > 0 || m.extra().count("accuracy") > 0;
    if (has_acc) {
      if (acc_before < 0) acc_before = m.accuracy();
      acc_after = m.accuracy();
    }
    if (m.extra().count("accuracy_before") > 0) acc_before = m.extra().at("accuracy_before");
    if (m.tokens_per_s() > 0) {
      tokens += m.tokens_per_s();
      ++tok_n;
    }
    switch_s += m.switch_seconds();
    for (const auto& [k, v] : m.phase_seconds()) {
      phases[k] += v;
      phase_total += v;
    }
  }
  // Reward curve: the mean reward of (up to) 10 equal spans of RL steps.
  std::vector<double> curve;
  const size_t spans = std::min<size_t>(10, rewards.size());
  for (size_t i = 0; i < spans; ++i) {
    const size_t b = i * rewards.size() / spans, e = (i + 1) * rewards.size() / spans;
    double sum = 0;
    for (size_t j = b; j < e; ++j) sum += rewards[j];
    curve.push_back(e > b ? sum / static_cast<double>(e - b) : 0);
  }
  if (!curve.empty()) s["reward_curve"] = curve;
  s["final_loss"] = final_loss;
  if (has_reward) s["final_reward"] = final_reward;
  if (acc_before >= 0) s["accuracy_before"] = acc_before;
  if (acc_after >= 0) s["accuracy_after"] = acc_after;
  s["phase_seconds"] = phases;
  if (tok_n > 0) s["mean_tokens_per_s"] = tokens / tok_n;
  if (switch_s > 0 && phase_total > 0) s["switch_share"] = switch_s / phase_total;
  s["worker_restarts"] = nlohmann::json::array();
  for (const auto& r : restarts) {
    s["worker_restarts"].push_back(
        {{"worker", r.member}, {"reason", r.reason}, {"time", r.time}, {"restart", r.restart}, {"pid", r.pid}});
  }
  // Workers that exited during the job and were not restarted.
  for (const auto& d : down) {
    s["workers_not_restarted"].push_back({{"worker", d.member}, {"reason", d.reason}, {"why", WhyNotRestarted(d)}});
  }
  s["output_dir"] = (dir / "final").string();
  s["metrics"] = (dir / "metrics.jsonl").string();
  s["events"] = (dir / "events.jsonl").string();
  std::ofstream(dir / "summary.json") << s.dump(2) << "\n";
  if (json_output) {
    std::cout << s.dump() << "\n";
    return;
  }
  std::cout << "\n== " << job.spec().name() << " (job " << job.id() << "): " << StateName(job.state())
            << (job.reason().empty() ? "" : " - " + job.reason()) << "\n";
  std::cout << absl::StrFormat("steps        %d/%d in %s (%d worker(s), %s)\n", job.step(), job.total_steps(),
                               wall_seconds < 60 ? absl::StrFormat("%.1f s", wall_seconds)
                                                 : FormatDuration(wall_seconds), job.spec().cluster().workers(),
                               common::DeviceName(job.spec().cluster().device()));
  if (final_loss != 0) std::cout << absl::StrFormat("final loss   %.4f\n", final_loss);
  if (has_reward) std::cout << absl::StrFormat("final reward %.4f\n", final_reward);
  if (acc_before >= 0) std::cout << absl::StrFormat("accuracy     %.3f -> %.3f\n", acc_before, acc_after);
  if (!curve.empty()) {
    std::cout << absl::StrFormat("reward curve (mean of %zu spans of ~%zu steps):", curve.size(),
                                 rewards.size() / curve.size());
    for (double r : curve) std::cout << absl::StrFormat(" %.2f", r);
    std::cout << "\n";
  }
  if (tok_n > 0) std::cout << absl::StrFormat("tokens/s     %.0f (mean over steps)\n", tokens / tok_n);
  if (!phases.empty()) {
    std::cout << "time/phase  ";
    for (const auto& [k, v] : phases) {
      std::cout << absl::StrFormat(" %s %.2fs (%.0f%%)", k, v, phase_total > 0 ? 100 * v / phase_total : 0);
    }
    std::cout << "\n";
  }
  if (switch_s > 0 && phase_total > 0) {
    std::cout << absl::StrFormat("switch share %.1f%% of phase time (%.2f s)\n", 100 * switch_s / phase_total, switch_s);
  }
  if (!restarts.empty()) {
    std::vector<std::string> items;
    for (const auto& r : restarts) items.push_back(absl::StrCat(r.member, " (", r.reason, ")"));
    if (items.size() > 4) {
      items.resize(4);
      items.push_back("...");
    }
    std::cout << "restarts     " << restarts.size() << ": " << absl::StrJoin(items, ", ") << "\n";
  }
  for (const auto& d : down) {
    std::cout << "not restarted " << d.member << " (" << d.reason << "): " << WhyNotRestarted(d) << "\n";
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) std::cout << "model        " << (dir / "final").string() << "\n";
  std::cout << "metrics      " << (dir / "metrics.jsonl").string() << "\n"
            << "events       " << (dir / "events.jsonl").string() << "\n"
            << "logs         " << (dir / "coordinator.log").string() << ", " << (dir / "worker-*.log").string() << "\n";
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
      "Usage: tandemctl run --local [--workers N] [--run-dir DIR] [--no-restart] JOB.yaml\n"
      "                            [--set key.path=value ...]\n"
      "Runs one job on this machine: starts tandem-coordinator and N tandem-worker processes on\n"
      "127.0.0.1 (ephemeral ports, fresh tokens), submits the job, shows progress, prints a summary\n"
      "and stops every process it started (also on failure and Ctrl-C).\n"
      "  --workers N     workers to start (default: the job's cluster.workers)\n"
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
      args, {{"set", "workers", "run-dir", "resume-from", "worker-device"}, {"local", "no-restart"}, {}}, usage, &code);
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
  fs::path dir = p->Has("run-dir") ? fs::path(p->Get("run-dir"))
                                   : fs::path("runs") / absl::StrCat(spec->name(), "-", Timestamp());
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
  const int threads = spec->cluster().threads_per_worker() > 0 ? spec->cluster().threads_per_worker()
                                                                : std::max(1, cores / workers);
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
  restart.stop_grace = kStopGrace;
  if (absl::Status st = cluster.StartWorkers(*worker_bin, dir, workers, device, threads, restart,
                                             [&events](const SupervisorEvent& e) { events.Supervisor(e); });
      !st.ok()) {
    return fail(std::string(st.message()), kExitFailed);
  }
  if (!json) {
    std::cerr << "tandemctl: coordinator at " << cluster.grpc_address() << " (metrics http://"
              << cluster.metrics_address() << "/metrics), " << workers << " " << device
              << " worker(s) x " << threads << " thread(s); run dir " << dir.string() << "\n"
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
      return fail(absl::StrCat("only ", idle, " of ", workers, " workers registered within ",
                               kRegisterTimeout.count(), " s; see ", dir.string(), "/worker-*.log"),
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
