// Unit tests of the pure parts of the worker daemon and tandemctl: backoff,
// argument parsing, exit codes, formatting, and child-process handling.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/synchronization/mutex.h"
#include "common/phase_failure.h"
#include "gtest/gtest.h"
#include "server/cli/child_process.h"
#include "server/cli/cli_args.h"
#include "server/cli/exit_codes.h"
#include "server/cli/format.h"
#include "server/cli/worker_supervisor.h"
#include "worker/daemon/backoff.h"
#include "worker/daemon/host_info.h"
#include "worker/daemon/report_envelope.h"

namespace tandem {
namespace {

// The daemon seals every report the same way: identity from the command,
// the outcome as ok/error/typed failure, bounded log lines.
TEST(ReportEnvelopeTest, SealsIdentityOutcomeAndBounds) {
  v1::PhaseCommand cmd;
  cmd.set_command_id("j-000001/g2/u3/p1");
  cmd.set_job_id("j-000001");
  cmd.set_generation(2);
  cmd.set_phase(v1::PHASE_UPDATE);
  cmd.set_step(3);
  v1::ReportPhaseRequest report;
  report.mutable_metrics()->set_loss(0.5);  // the engine's result stays
  for (size_t i = 0; i < worker::kMaxReportLogLines + 10; ++i) report.add_log_lines(std::string(5000, 'x'));
  worker::SealReport("w-1", cmd,
                     common::WithFailureKind(absl::FailedPreconditionError("gloo: communicator broken"),
                                             v1::PHASE_FAILURE_KIND_RETRYABLE),
                     1.5, &report);
  EXPECT_EQ(report.worker_id(), "w-1");
  EXPECT_EQ(report.command_id(), "j-000001/g2/u3/p1");
  EXPECT_EQ(report.generation(), 2);
  EXPECT_EQ(report.phase(), v1::PHASE_UPDATE);
  EXPECT_EQ(report.step(), 3);
  EXPECT_EQ(report.seconds(), 1.5);
  EXPECT_EQ(report.metrics().loss(), 0.5);
  EXPECT_FALSE(report.ok());
  EXPECT_EQ(report.error(), "gloo: communicator broken");
  EXPECT_EQ(report.failure().kind(), v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_EQ(report.failure().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(report.retryable());
  EXPECT_EQ(static_cast<size_t>(report.log_lines_size()), worker::kMaxReportLogLines);
  EXPECT_EQ(report.log_lines(0).size(), worker::kMaxReportLineChars + 3);
  worker::SealReport("w-1", cmd, absl::OkStatus(), 2.0, &report);
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.error().empty());
  EXPECT_FALSE(report.has_failure());
  EXPECT_FALSE(report.retryable());
}

using std::chrono::milliseconds;

TEST(BackoffTest, GrowsToTheCapWithBoundedJitter) {
  worker::BackoffPolicy p{milliseconds(100), milliseconds(2000), 2.0, 0.2};
  worker::Backoff b(p, 42);
  double expected = 100;
  for (int i = 0; i < 20; ++i) {
    const auto d = b.Next().count();
    const double base = std::min(expected, 2000.0);
    EXPECT_GE(d, static_cast<int64_t>(base * 0.8) - 1) << i;
    EXPECT_LE(d, std::min<int64_t>(2000, static_cast<int64_t>(base * 1.2) + 1)) << i;
    expected *= 2;
  }
  b.Reset();
  EXPECT_LE(b.Next().count(), 121);
}

TEST(BackoffTest, NoOverflowAfterManyAttempts) {
  worker::Backoff b(worker::BackoffPolicy{milliseconds(1), milliseconds(500), 10.0, 0.0}, 1);
  for (int i = 0; i < 1000; ++i) EXPECT_LE(b.Next().count(), 500);
  EXPECT_EQ(b.Next().count(), 500);
}

TEST(HostInfoTest, Basics) {
  EXPECT_FALSE(worker::HostName().empty());
  EXPECT_GT(worker::PhysicalMemoryBytes(), 0);
  EXPECT_GT(worker::ResidentMemoryBytes(), 0);
  EXPECT_EQ(worker::LocalAddressTowards("127.0.0.1:7070"), "127.0.0.1");
  EXPECT_EQ(worker::LocalAddressTowards("no-such-host.invalid:1"), "127.0.0.1");
}

TEST(CliArgsTest, FlagsValuesAndPositionals) {
  cli::FlagSpec spec{{"set", "workers"}, {"local", "follow"}, {{"f", "follow"}}};
  auto p = cli::ParseArgs({"job.yaml", "--set", "a.b=1", "--set=c=2", "--workers", "3", "-f", "--local",
                           "--coordinator=h:1", "--", "--not-a-flag"},
                          spec);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->positional, (std::vector<std::string>{"job.yaml", "--not-a-flag"}));
  EXPECT_EQ(p->GetAll("set"), (std::vector<std::string>{"a.b=1", "c=2"}));
  EXPECT_EQ(p->Get("workers"), "3");
  EXPECT_TRUE(p->Has("follow"));
  EXPECT_TRUE(p->Has("local"));
  EXPECT_EQ(p->Get("coordinator"), "h:1");
}

TEST(CliArgsTest, ErrorsNameTheFlag) {
  auto p = cli::ParseArgs({"--bogus"}, {});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--bogus"), std::string::npos);
  p = cli::ParseArgs({"--workers"}, {{"workers"}, {}, {}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("needs a value"), std::string::npos);
  EXPECT_FALSE(cli::ParseInt("--workers", "12x", 1, 10).ok());
  EXPECT_FALSE(cli::ParseInt("--workers", "0", 1, 10).ok());
  EXPECT_FALSE(cli::ParseInt("--workers", "99999999999999999999999", 1, 10).ok());
  EXPECT_EQ(*cli::ParseInt("--workers", "7", 1, 10), 7);
}

TEST(ExitCodeTest, Mapping) {
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status::OK), 0);
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status(grpc::StatusCode::UNAVAILABLE, "")), 4);
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "")), 5);
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "")), 5);
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "")), 2);
  EXPECT_EQ(cli::ExitCodeFor(grpc::Status(grpc::StatusCode::NOT_FOUND, "")), 1);
}

TEST(FormatTest, DurationsAndProgress) {
  EXPECT_EQ(cli::FormatDuration(7), "0:07");
  EXPECT_EQ(cli::FormatDuration(205), "3:25");
  EXPECT_EQ(cli::FormatDuration(3723), "1:02:03");
  EXPECT_EQ(cli::FormatDuration(-1), "-");
  tandem::v1::Job job;
  job.set_total_steps(200);
  job.set_started_at(1000);
  job.mutable_spec()->set_kind(tandem::v1::JOB_KIND_GRPO);
  tandem::v1::StepMetrics m;
  m.set_step(50);
  m.set_reward_mean(0.5);
  m.set_accuracy(0.75);
  m.set_kl(0.0012);
  m.set_tokens_per_s(1234);
  const std::string line = cli::ProgressLine(job, m, 1100);
  EXPECT_NE(line.find("step 50/200"), std::string::npos) << line;
  EXPECT_NE(line.find("reward 0.500"), std::string::npos) << line;
  EXPECT_NE(line.find("acc 0.750"), std::string::npos) << line;
  EXPECT_NE(line.find("kl 0.0012"), std::string::npos) << line;
  EXPECT_NE(line.find("1234 tok/s"), std::string::npos) << line;
  EXPECT_NE(line.find("elapsed 1:40"), std::string::npos) << line;
  EXPECT_NE(line.find("eta 5:00"), std::string::npos) << line;
}

TEST(ChildProcessTest, StopsWithSigtermAndEscalatesToSigkill) {
  const std::string log = ::testing::TempDir() + "/child.log";
  auto polite = cli::ChildProcess::Start({"/bin/sleep", {"30"}, log, false});
  ASSERT_TRUE(polite.ok()) << polite.status();
  // Ignores SIGTERM: needs the SIGKILL after the grace period.
  auto stubborn = cli::ChildProcess::Start({"/bin/bash", {"-c", "trap '' TERM; sleep 30 & wait"}, log, false});
  ASSERT_TRUE(stubborn.ok()) << stubborn.status();
  EXPECT_TRUE((*polite)->Running());
  EXPECT_EQ(getpgid((*polite)->pid()), (*polite)->pid()) << "own process group";
  // The stubborn one has set its trap once it has started its child.
  const std::string children =
      "/proc/" + std::to_string((*stubborn)->pid()) + "/task/" + std::to_string((*stubborn)->pid()) + "/children";
  bool trapped = false;
  for (int i = 0; i < 500 && !trapped; ++i) {
    std::ifstream in(children);
    pid_t child = 0;
    trapped = static_cast<bool>(in >> child);
    if (!trapped) usleep(10 * 1000);
  }
  ASSERT_TRUE(trapped) << "bash started no child in 5 s";
  const auto t0 = std::chrono::steady_clock::now();
  cli::StopAll({polite->get(), stubborn->get()}, milliseconds(500));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_FALSE((*polite)->Running());
  EXPECT_FALSE((*stubborn)->Running());
  EXPECT_EQ((*polite)->ExitText(), "signal 15");
  EXPECT_EQ((*stubborn)->ExitText(), "signal 9");
  EXPECT_EQ((*polite)->ExitReason(), "signal 15: terminated");
  EXPECT_EQ((*stubborn)->ExitReason(), "signal 9: killed");
  EXPECT_FALSE((*stubborn)->ExitedCleanly());
}

TEST(ChildProcessTest, OomKillCountOfCgroupFiles) {
  // cgroup v2 memory.events and v1 memory.oom_control.
  EXPECT_EQ(cli::ParseOomKillCount("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 2);
  EXPECT_EQ(cli::ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\noom_kill 17\n"), 17);
  EXPECT_EQ(cli::ParseOomKillCount("oom_kill_disable 0\nunder_oom 0\n"), std::nullopt);  // kernels before 4.13
  EXPECT_EQ(cli::ParseOomKillCount("oom_kill x\n"), std::nullopt);
  EXPECT_EQ(cli::ParseOomKillCount(""), std::nullopt);
}

TEST(ChildProcessTest, ExitReasonAndInheritedDescriptors) {
  const std::string log = ::testing::TempDir() + "/fds.log";
  std::remove(log.c_str());
  // A descriptor opened without O_CLOEXEC (as std::ofstream does) must not
  // reach the child.
  const int opened = open("/dev/null", O_RDONLY);
  ASSERT_GE(opened, 0);
  const int leaky = fcntl(opened, F_DUPFD, 100);  // clear of the one ls opens itself
  close(opened);
  ASSERT_GE(leaky, 100);
  auto c = cli::ChildProcess::Start({"/bin/sh", {"-c", "ls /proc/self/fd | tr '\\n' ' '; exit 3"}, log, false});
  close(leaky);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int i = 0; i < 500 && (*c)->Running(); ++i) usleep(10 * 1000);
  EXPECT_EQ((*c)->ExitReason(), "exit 3");
  EXPECT_FALSE((*c)->ExitedCleanly());
  std::ifstream in(log);
  std::string fds((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(fds.find("0 1 2 "), std::string::npos) << fds;
  EXPECT_EQ(fds.find(" " + std::to_string(leaky) + " "), std::string::npos) << fds;
}

TEST(ChildProcessTest, PipesStdout) {
  auto c = cli::ChildProcess::Start({"/bin/echo", {"hello ready"}, ::testing::TempDir() + "/echo.log", true});
  ASSERT_TRUE(c.ok());
  char buf[64] = {0};
  ssize_t n = read((*c)->stdout_fd(), buf, sizeof(buf) - 1);
  EXPECT_GT(n, 0);
  EXPECT_EQ(std::string(buf), "hello ready\n");
  for (int i = 0; i < 200 && (*c)->Running(); ++i) usleep(10 * 1000);
  (*c)->Stop(milliseconds(1000));
  EXPECT_EQ((*c)->ExitText(), "exit 0");
  EXPECT_TRUE((*c)->ExitedCleanly());
}

// Supervised members are /bin/sh scripts; events are collected from the
// supervisor thread.
class SupervisorTest : public ::testing::Test {
 protected:
  using Kind = cli::SupervisorEvent::Kind;
  static cli::SupervisorOptions Fast() {
    cli::SupervisorOptions o;
    o.max_restarts = 3;
    o.initial_backoff = milliseconds(20);
    o.max_backoff = milliseconds(40);
    o.poll = milliseconds(10);
    o.stop_grace = milliseconds(2000);
    return o;
  }
  cli::WorkerSupervisor::EventFn Collect() {
    return [this](const cli::SupervisorEvent& e) {
      absl::MutexLock lock(&mu_);
      events_.push_back(e);
    };
  }
  std::vector<cli::SupervisorEvent> Events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  cli::SupervisedMember Member(const std::string& name, const std::string& script) {
    const std::string log = ::testing::TempDir() + "/sup-" + name + ".log";
    std::remove(log.c_str());
    return {name, {"/bin/sh", {"-c", script}, log, false}};
  }
  // Polls until pred() holds, at most `limit`.
  template <typename Pred>
  static bool WaitFor(Pred pred, milliseconds limit = milliseconds(10000)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (pred()) return true;
      usleep(10 * 1000);
    }
    return pred();
  }
  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  absl::Mutex mu_;
  std::vector<cli::SupervisorEvent> events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(SupervisorTest, BackoffDoublesToTheCap) {
  cli::SupervisorOptions o;  // the defaults --help states
  EXPECT_EQ(o.max_restarts, 5);
  std::vector<int64_t> got;
  for (int n = 0; n < 6; ++n) got.push_back(cli::RestartBackoff(o, n).count());
  EXPECT_EQ(got, (std::vector<int64_t>{500, 1000, 2000, 4000, 4000, 4000}));
}

TEST_F(SupervisorTest, RestartsAFailingMemberUpToTheBoundThenGivesUp) {
  cli::WorkerSupervisor sup(Fast(), Collect());
  auto m = Member("crashy", "echo started; sleep 0.2; exit 3");
  ASSERT_TRUE(sup.Start({m}).ok());
  sup.AllowRestarts();
  ASSERT_TRUE(WaitFor([&] { return !sup.Down().empty(); })) << "never gave up";
  EXPECT_EQ(sup.Down().front().kind, Kind::kGaveUp);
  EXPECT_EQ(sup.restart_count(), 3);
  // The callback runs after the supervisor records the event: wait for it.
  ASSERT_TRUE(WaitFor([&] { return Events().size() >= 4; }));
  const auto events = Events();
  ASSERT_EQ(events.size(), 4u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].kind, Kind::kRestarted);
    EXPECT_EQ(events[i].restart, i + 1);
    EXPECT_EQ(events[i].reason, "exit 3");
    EXPECT_GT(events[i].pid, 0);
  }
  EXPECT_EQ(cli::DescribeEvent(events[0]), "worker crashy exited (exit 3); restarted (1 of 3)");
  EXPECT_EQ(events[3].kind, Kind::kGaveUp);
  EXPECT_NE(cli::DescribeEvent(events[3]).find("all 3 restarts are used"), std::string::npos);
  // Same spec each time, the log appended to: four runs.
  EXPECT_EQ(ReadFile(m.spec.log_file), "started\nstarted\nstarted\nstarted\n");
  sup.Stop();
}

TEST_F(SupervisorTest, CleanExitAndNoRestartAreFinal) {
  cli::SupervisorOptions off = Fast();
  off.restart = false;
  cli::WorkerSupervisor sup(off, Collect());
  ASSERT_TRUE(sup.Start({Member("killed", "sleep 0.2; kill -9 $$")}).ok());
  sup.AllowRestarts();  // has no effect with restart off
  ASSERT_TRUE(WaitFor([&] { return !sup.Down().empty(); }));
  EXPECT_EQ(sup.Down().front().reason, "signal 9: killed");
  EXPECT_EQ(sup.Down().front().note, "--no-restart");
  sup.Stop();

  cli::WorkerSupervisor clean(Fast(), nullptr);
  ASSERT_TRUE(clean.Start({Member("done", "sleep 0.2; exit 0")}).ok());
  clean.AllowRestarts();
  ASSERT_TRUE(WaitFor([&] { return !clean.Down().empty(); }));
  EXPECT_EQ(clean.Down().front().note, "clean exit");
  EXPECT_EQ(clean.restart_count(), 0);
}

TEST_F(SupervisorTest, ExitBeforeRestartsAreAllowedIsFinal) {
  cli::WorkerSupervisor sup(Fast(), Collect());
  ASSERT_TRUE(sup.Start({Member("early", "exit 2")}).ok());
  ASSERT_TRUE(WaitFor([&] { return !sup.Down().empty(); }));
  sup.AllowRestarts();
  // What is tested is that nothing happens: no restart comes a while after
  // restarts are allowed.
  usleep(200 * 1000);
  EXPECT_EQ(sup.Down().front().note, "during start-up");
  EXPECT_EQ(sup.restart_count(), 0);
}

TEST_F(SupervisorTest, StopEndsAMemberRestartedMomentsBeforeAndItsGroup) {
  // Each run leaves a grandchild in its process group and records its pid.
  const std::string pids = ::testing::TempDir() + "/sup-pids.txt";
  std::remove(pids.c_str());
  cli::WorkerSupervisor sup(Fast(), Collect());
  auto m = Member("flaky", "sleep 30 & echo $! >> " + pids + "; sleep 0.1; exit 1");
  ASSERT_TRUE(sup.Start({m}).ok());
  sup.AllowRestarts();
  ASSERT_TRUE(WaitFor([&] { return sup.restart_count() >= 1; }));
  // The supervisor's own record: the event callback may not have run yet.
  const pid_t restarted = sup.restarts().front().pid;
  sup.Stop();  // right after the restart
  EXPECT_NE(kill(restarted, 0), 0) << "restarted member still there";
  std::ifstream in(pids);
  int n = 0;
  for (pid_t p; in >> p; ++n) {
    // Killed with its group: gone, or a zombie until init reaps it.
    auto dead = [p] {
      std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
      std::string pid_field, comm, state;
      return kill(p, 0) != 0 || !(stat >> pid_field >> comm >> state) || state == "Z";
    };
    EXPECT_TRUE(WaitFor(dead, milliseconds(3000))) << "grandchild " << p << " left";
  }
  EXPECT_GE(n, 1);
  // Nothing restarts after Stop().
  const size_t after = Events().size();
  usleep(200 * 1000);  // what is tested is that nothing happens for a while
  EXPECT_EQ(Events().size(), after);
}

TEST_F(SupervisorTest, StopDuringTheBackoffDoesNotRestart) {
  cli::SupervisorOptions slow = Fast();
  slow.initial_backoff = milliseconds(10000);
  slow.max_backoff = milliseconds(10000);
  cli::WorkerSupervisor sup(slow, Collect());
  const std::string a_pid = ::testing::TempDir() + "/sup-a-pid.txt";
  std::remove(a_pid.c_str());
  ASSERT_TRUE(sup.Start({Member("a", "echo $$ > " + a_pid + "; sleep 0.1; exit 1"), Member("b", "sleep 30")}).ok());
  sup.AllowRestarts();
  // a has exited, the supervisor has reaped it, and it waits for its restart.
  ASSERT_TRUE(WaitFor([&] {
    std::ifstream in(a_pid);
    pid_t p = 0;
    return static_cast<bool>(in >> p) && kill(p, 0) != 0;
  }));
  const auto t0 = std::chrono::steady_clock::now();
  sup.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_EQ(sup.restart_count(), 0);
  EXPECT_TRUE(Events().empty());
}

TEST_F(SupervisorTest, StartFailureLeavesNothingRunning) {
  cli::WorkerSupervisor sup(Fast(), Collect());
  auto ok = Member("ok", "sleep 30");
  auto bad = Member("bad", "true");
  bad.spec.log_file = "/no/such/dir/bad.log";
  absl::Status st = sup.Start({ok, bad});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bad"), std::string::npos) << st;
  sup.Stop();
}

TEST(FindProgramTest, EnvOverrideAndPath) {
  setenv("TANDEM_TEST_BIN", "/bin/sh", 1);
  EXPECT_EQ(*cli::FindProgram("whatever", "TANDEM_TEST_BIN"), "/bin/sh");
  setenv("TANDEM_TEST_BIN", "/no/such/bin", 1);
  EXPECT_FALSE(cli::FindProgram("whatever", "TANDEM_TEST_BIN").ok());
  unsetenv("TANDEM_TEST_BIN");
  auto sh = cli::FindProgram("sh", "TANDEM_TEST_BIN");
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ(std::filesystem::path(*sh).filename(), "sh");
  EXPECT_FALSE(cli::FindProgram("tandem-no-such-program", "TANDEM_TEST_BIN").ok());
}

}  // namespace
}  // namespace tandem
