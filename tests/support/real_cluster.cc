// Real-process test clusters through tests/support/cluster.py (see real_cluster.h).
#include "tests/support/real_cluster.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tandem::test_support {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RealCluster>> RealCluster::Up(const RealClusterOptions& options) {
  if (!std::filesystem::exists("/usr/bin/python3")) {
    return absl::FailedPreconditionError("/usr/bin/python3 not found: install python3 (the cluster launcher)");
  }
  std::filesystem::create_directories(options.dir);
  std::unique_ptr<RealCluster> c(new RealCluster(options));
  std::vector<std::string> args = {"--bin", options.bin_dir, "--workers", std::to_string(options.workers)};
  // "--flag=value": a value that starts with "--" stays the option's value.
  for (const auto& a : options.coordinator_args) args.push_back("--coordinator-arg=" + a);
  for (const auto& a : options.worker_args) args.push_back("--worker-arg=" + a);
  auto out = c->Run("up", args);
  if (!out.ok()) {
    c->Down().IgnoreError();  // whatever started is stopped
    return out.status();
  }
  if (auto st = c->Refresh(); !st.ok()) return st;
  return c;
}

RealCluster::~RealCluster() {
  if (!down_) Down().IgnoreError();
}

std::string RealCluster::admin_token() const {
  return std::string(absl::StripAsciiWhitespace(ReadFile(desc_.value("admin_token_file", ""))));
}

int RealCluster::Pid(const std::string& member) const {
  const auto& members = desc_.at("members");
  return members.contains(member) ? members.at(member).value("pid", -1) : -1;
}

absl::StatusOr<int> RealCluster::Kill(const std::string& member, int sig) {
  auto out = Run("signal", {member, "--signal", std::to_string(sig), "--wait-exit", "15"});
  if (!out.ok()) return out.status();
  if (auto st = Refresh(); !st.ok()) return st;
  int code = -1;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*out), &code)) {
    return absl::InternalError(absl::StrCat("cluster.py signal printed '", *out, "', not an exit code"));
  }
  return code;
}

absl::Status RealCluster::Restart(const std::string& member, bool wait) {
  std::vector<std::string> args = {member};
  if (wait) args.push_back("--wait");
  if (auto out = Run("restart", args); !out.ok()) return out.status();
  return Refresh();
}

absl::Status RealCluster::WaitWorkers(const std::vector<std::string>& names, const std::string& state) {
  std::vector<std::string> args = {"--state", state};
  args.insert(args.end(), names.begin(), names.end());
  if (auto out = Run("wait-workers", args); !out.ok()) return out.status();
  return Refresh();
}

absl::Status RealCluster::Down() {
  down_ = true;
  if (auto out = Run("down", {}); !out.ok()) return out.status();
  return Refresh();
}

absl::Status RealCluster::Refresh() {
  const std::string path = options_.dir + "/cluster.json";
  auto j = nlohmann::json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InternalError(absl::StrCat(path, " is not JSON"));
  desc_ = std::move(j);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RealCluster::Run(const std::string& cmd, const std::vector<std::string>& args) {
  const std::string err = options_.dir + "/cluster-cli.err";
  std::string line = absl::StrCat("/usr/bin/python3 ", Quote(options_.launcher), " ", cmd, " --dir ",
                                  Quote(options_.dir), " --timeout ", options_.timeout_s);
  for (const auto& a : args) absl::StrAppend(&line, " ", Quote(a));
  absl::StrAppend(&line, " 2>", Quote(err));
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", line));
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cluster.py ", cmd, " failed (exit ", WEXITSTATUS(rc),
                                               "): ", absl::StripAsciiWhitespace(ReadFile(err)), "; command: ", line));
  }
  return out;
}

}  // namespace tandem::test_support
