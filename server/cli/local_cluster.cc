#include "server/cli/local_cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"

namespace tandem::cli {
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

constexpr auto kReadyTimeout = std::chrono::seconds(60);

}  // namespace

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

void LocalCluster::Shutdown() {
  monitor_stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  // Workers first get their stop signal with the coordinator still up
  // (they report and leave), then the coordinator. Supervision ends before.
  if (supervisor_) supervisor_->Stop();
  if (coordinator_) StopAll({coordinator_.get()}, kLocalStopGrace);
  if (drain_.joinable()) drain_.join();  // the pipe is at EOF now
  coordinator_.reset();
}

absl::Status LocalCluster::StartCoordinator(const std::string& program, const fs::path& dir, Canceller* cancel) {
  log_ = dir / "coordinator.log";
  ChildSpec spec;
  spec.path = program;
  spec.args = {"--listen",           "127.0.0.1:0",
               "--metrics-listen",   "127.0.0.1:0",
               "--state-dir",        (dir / "state").string(),
               "--admin-token-file", (dir / "admin.token").string(),
               "--join-token-file",  (dir / "join.token").string()};
  spec.log_file = log_.string();
  spec.pipe_stdout = true;
  ASSIGN_OR_RETURN(coordinator_, ChildProcess::Start(spec));
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

absl::Status LocalCluster::StartWorkers(const std::string& program, const fs::path& dir, int n, int nodes,
                                        const std::string& device, int threads, const SupervisorOptions& options,
                                        WorkerSupervisor::EventFn on_event) {
  std::vector<SupervisedMember> members;
  for (int i = 0; i < n; ++i) {
    SupervisedMember m;
    m.name = absl::StrCat("local-", i);
    ChildSpec& spec = m.spec;
    spec.path = program;
    spec.args = {"--coordinator", grpc_address_,        "--name",    m.name,         "--device",
                 device,          "--data-address",     "127.0.0.1", "--token-file", (dir / "join.token").string(),
                 "--threads",     absl::StrCat(threads)};
    if (nodes > 1) spec.args.insert(spec.args.end(), {"--node", absl::StrCat("local-node", i * nodes / n)});
    // One worker per GPU: local worker i computes on GPU i.
    if (device == "cuda") spec.args.insert(spec.args.end(), {"--device-index", absl::StrCat(i)});
    spec.log_file = (dir / absl::StrCat("worker-", i, ".log")).string();
    members.push_back(std::move(m));
  }
  supervisor_ = std::make_unique<WorkerSupervisor>(options, std::move(on_event));
  return supervisor_->Start(std::move(members));
}

void LocalCluster::StartMonitor(Canceller* cancel) {
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

std::optional<SupervisorEvent> LocalCluster::FirstDownWorker() const {
  auto down = supervisor_->Down();
  if (down.empty()) return std::nullopt;
  return down.front();
}

std::vector<SupervisorEvent> LocalCluster::restarts() const {
  return supervisor_ ? supervisor_->restarts() : std::vector<SupervisorEvent>{};
}

std::vector<SupervisorEvent> LocalCluster::down_workers() const {
  return supervisor_ ? supervisor_->Down() : std::vector<SupervisorEvent>{};
}

void LocalCluster::AppendLog(const std::string& text) {
  std::ofstream out(log_, std::ios::app);
  out << text << (text.empty() || text.back() != '\n' ? "\n" : "");
}

}  // namespace tandem::cli
