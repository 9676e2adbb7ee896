#include "server/cli/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem::cli {
namespace fs = std::filesystem;

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const ChildSpec& spec) {
  // Everything the child needs is prepared before fork.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(spec.path);
  argv_storage.insert(argv_storage.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int log_fd = open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", spec.log_file, ": ", strerror(errno)));
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int pipe_fds[2] = {-1, -1};
  if (spec.pipe_stdout && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  // Every signal blocked across fork: until the child has reset tandemctl's
  // handlers (SignalWatcher's) to the defaults, a signal for it - a SIGTERM
  // from a Stop() right after a restart - waits instead of running our
  // handler in the child.
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = fork();
  if (pid != 0) pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) {
    const int err = errno;
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    if (pipe_fds[0] >= 0) {
      close(pipe_fds[0]);
      close(pipe_fds[1]);
    }
    return absl::InternalError(absl::StrCat("fork: ", strerror(err)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
    }
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, nullptr);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(spec.pipe_stdout ? pipe_fds[1] : log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    // Nothing else of tandemctl's (gRPC sockets, files of other threads
    // opened without O_CLOEXEC) reaches the program.
    close_range(3, ~0U, 0);
    execv(argv[0], argv.data());
    const char msg[] = "tandemctl: exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent: no race with a kill(-pid)
  close(log_fd);
  if (null_fd >= 0) close(null_fd);
  auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
  child->pid_ = pid;
  child->name_ = fs::path(spec.path).filename().string();
  child->oom_kills_at_start_ = CgroupOomKills();
  if (spec.pipe_stdout) {
    close(pipe_fds[1]);
    child->stdout_fd_ = pipe_fds[0];
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (!reaped_) Stop(std::chrono::milliseconds(5000));
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool ChildProcess::Running() {
  if (reaped_) return false;
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  // WNOWAIT: leave the zombie, so the pid (and group id) cannot be reused
  // before we signal the group one last time and reap.
  if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;
}

std::string ChildProcess::ExitText() {
  if (!reaped_) {
    if (Running()) return "";
    Reap();
  }
  if (WIFEXITED(wait_status_)) return absl::StrCat("exit ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) return absl::StrCat("signal ", WTERMSIG(wait_status_));
  return "ended";
}

std::string ChildProcess::ExitReason() {
  const std::string text = ExitText();
  if (text.empty() || !WIFSIGNALED(wait_status_)) return text;
  const char* descr = sigdescr_np(WTERMSIG(wait_status_));  // thread safe, unlike strsignal
  std::string name = descr != nullptr ? descr : "unknown signal";
  if (!name.empty()) name[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(name[0])));
  std::string oom;
  if (WTERMSIG(wait_status_) == SIGKILL && oom_kills_at_start_) {
    // The kernel's OOM killer sends SIGKILL and leaves no other trace the
    // parent can see: its count for the cgroup tells that it struck.
    const std::optional<int64_t> now = CgroupOomKills();
    if (now && *now > *oom_kills_at_start_) {
      oom = absl::StrCat(" (out of memory: the kernel's OOM killer killed ", *now - *oom_kills_at_start_,
                         " process(es) of this cgroup while it ran)");
    }
  }
  return absl::StrCat(text, ": ", name, WCOREDUMP(wait_status_) ? " (core dumped)" : "", oom);
}

std::optional<int64_t> ParseOomKillCount(std::string_view text) {
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    int64_t n = 0;
    if (absl::ConsumePrefix(&line, "oom_kill ") && absl::SimpleAtoi(line, &n) && n >= 0) return n;
  }
  return std::nullopt;
}

std::optional<int64_t> CgroupOomKills() {
  // This process's cgroup ("0::/path" on v2, "N:...memory...:/path" on v1),
  // then the root of the mount, which is this cgroup under a cgroup
  // namespace (containers).
  std::vector<std::string> files;
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) files.push_back("/sys/fs/cgroup" + parts[2] + "/memory.events");
    for (absl::string_view c : absl::StrSplit(parts[1], ',')) {
      if (c == "memory") files.push_back("/sys/fs/cgroup/memory" + parts[2] + "/memory.oom_control");
    }
  }
  files.push_back("/sys/fs/cgroup/memory.events");
  files.push_back("/sys/fs/cgroup/memory/memory.oom_control");
  for (const std::string& f : files) {
    std::ifstream in(f);
    if (!in) continue;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (auto n = ParseOomKillCount(text)) return n;
  }
  return std::nullopt;
}

bool ChildProcess::ExitedCleanly() {
  return !ExitText().empty() && WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0;
}

void ChildProcess::Reap() {
  if (reaped_) return;
  kill(-pid_, SIGKILL);  // anything left in its group; the zombie keeps the id ours
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  wait_status_ = status;
  reaped_ = true;
}

void ChildProcess::KillAndReap() {
  if (reaped_) return;
  kill(-pid_, SIGKILL);
  Reap();
}

void ChildProcess::Stop(std::chrono::milliseconds grace) { StopAll({this}, grace); }

void StopAll(const std::vector<ChildProcess*>& children, std::chrono::milliseconds grace, int signal) {
  for (ChildProcess* c : children) {
    if (c != nullptr && c->Running()) kill(-c->pid(), signal);
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    bool any = false;
    for (ChildProcess* c : children) any = any || (c != nullptr && c->Running());
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (ChildProcess* c : children) {
    if (c != nullptr) c->KillAndReap();  // stragglers get SIGKILL; the group too
  }
}

namespace {
bool Executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}
}  // namespace

absl::StatusOr<std::string> FindProgram(const std::string& name, const std::string& env_var) {
  if (const char* env = std::getenv(env_var.c_str()); env != nullptr && *env) {
    if (Executable(env)) return std::string(env);
    return absl::NotFoundError(absl::StrCat(env_var, "=", env, " is not an executable file"));
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& p :
         {dir / name, dir.parent_path() / name, dir.parent_path().parent_path() / "worker" / "daemon" / name,
          dir.parent_path().parent_path() / "bin" / name}) {
      if (Executable(p)) return p.string();
    }
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view d : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      const fs::path p = fs::path(std::string(d)) / name;
      if (Executable(p)) return p.string();
    }
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, " next to tandemctl or on PATH (set ", env_var, ")"));
}

}  // namespace tandem::cli
