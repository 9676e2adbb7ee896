// Failure paths of the Gloo Collective: rendezvous and operation timeouts,
// Abort() from another thread, a peer that goes away (thread or process),
// and the broken-communicator rule. Every case must end within its timeout.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "absl/strings/match.h"
#include "tests/comm/comm_test_util.h"
#include "worker/comm/file_store.h"

extern char** environ;

namespace tandem::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Two connected ranks (threads) for the tests below.
struct Pair2 {
  InMemoryStore store;
  std::unique_ptr<Collective> c[2];
  explicit Pair2(milliseconds timeout = milliseconds(10000)) {
    std::thread t([&] { c[1] = *MakeCollective("gloo", store, 1, 2, testing::TestOptions(timeout)); });
    auto c0 = MakeCollective("gloo", store, 0, 2, testing::TestOptions(timeout));
    t.join();
    EXPECT_TRUE(c0.ok()) << c0.status();
    c[0] = std::move(*c0);
  }
};

TEST(Failure, RendezvousTimesOutWhenARankNeverJoins) {
  InMemoryStore store;
  const auto t0 = Clock::now();
  auto c = MakeCollective("gloo", store, 0, 2, testing::TestOptions(milliseconds(500)));
  ASSERT_FALSE(c.ok());
  EXPECT_LT(Seconds(t0), 5.0);
  EXPECT_NE(c.status().message().find("gloo"), std::string::npos) << c.status();
}

TEST(Failure, AllreduceTimesOutWhenPeerNeverCalls) {
  Pair2 p;
  ASSERT_TRUE(p.c[0] && p.c[1]);
  std::vector<float> data(100, 1.f);
  const auto t0 = Clock::now();
  absl::Status s = p.c[0]->allreduce(data.data(), data.size(), ReduceOp::kSum, milliseconds(300));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Seconds(t0), 3.0);
  EXPECT_TRUE(absl::StartsWith(s.message(), "gloo: allreduce failed")) << s;
  // Broken from now on: later calls fail fast.
  absl::Status again = p.c[0]->barrier(milliseconds(300));
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

TEST(Failure, AbortUnblocksWaitingRecv) {
  Pair2 p;
  ASSERT_TRUE(p.c[0] && p.c[1]);
  std::vector<float> buf(10);
  const auto t0 = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    p.c[0]->Abort();
  });
  absl::Status s = p.c[0]->recv(buf.data(), 40, 1, 0, milliseconds(30000));
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(Seconds(t0), 3.0);
  // Every later call fails too.
  EXPECT_EQ(p.c[0]->barrier(milliseconds(1000)).code(), absl::StatusCode::kAborted);
}

TEST(Failure, AbortUnblocksWaitingAllreduceAndPeerSeesIt) {
  Pair2 p;
  ASSERT_TRUE(p.c[0] && p.c[1]);
  // Rank 1 waits in a recv that nobody will satisfy; rank 0 waits in an
  // allreduce rank 1 never joins. Abort rank 0: both return promptly.
  absl::Status s1;
  std::thread peer([&] {
    std::vector<float> b(4);
    s1 = p.c[1]->recv(b.data(), 16, 0, 9, milliseconds(30000));
  });
  std::vector<float> data(1 << 16, 1.f);
  const auto t0 = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    p.c[0]->Abort();
  });
  absl::Status s0 = p.c[0]->allreduce(data.data(), data.size(), ReduceOp::kSum, milliseconds(30000));
  aborter.join();
  peer.join();
  EXPECT_EQ(s0.code(), absl::StatusCode::kAborted) << s0;
  EXPECT_FALSE(s1.ok());
  EXPECT_LT(Seconds(t0), 5.0);
}

TEST(Failure, PeerThreadDestroysItsCommunicatorMidCollective) {
  Pair2 p;
  ASSERT_TRUE(p.c[0] && p.c[1]);
  std::thread peer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    p.c[1].reset();  // dies without joining the allreduce
  });
  std::vector<float> data(1000, 1.f);
  const auto t0 = Clock::now();
  absl::Status s = p.c[0]->allreduce(data.data(), data.size(), ReduceOp::kSum, milliseconds(10000));
  peer.join();
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Seconds(t0), 10.5);
}

// --- N real processes over a FileStore -------------------------------------

std::string PeerBinary() {
  // comm_peer_process sits next to this test binary.
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "comm_peer_process").string();
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return -1;
  }
  return pid;
}

std::string TempDir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / (name + "." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TEST(Processes, ThreeProcessesAllreduceAndAllScan) {
  const std::string dir = TempDir("tandem_comm_procs");
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    pids.push_back(Spawn({PeerBinary(), dir, std::to_string(r), "3", "check"}));
    ASSERT_GT(pids.back(), 0);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  std::filesystem::remove_all(dir);
}

TEST(Processes, KilledPeerProcessGivesAnErrorNotAHang) {
  const std::string dir = TempDir("tandem_comm_kill");
  // The peer joins, does one allreduce, then sleeps; we kill it while this
  // rank waits in the second allreduce.
  pid_t pid = Spawn({PeerBinary(), dir, "1", "2", "sleep"});
  ASSERT_GT(pid, 0);
  FileStore store(dir);
  auto c = MakeCollective("gloo", store, 0, 2, testing::TestOptions(milliseconds(20000)));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data(100, 1.f);
  ASSERT_TRUE((*c)->allreduce(data.data(), 100, ReduceOp::kSum, milliseconds(20000)).ok());
  EXPECT_EQ(data[0], 3.f);  // 1 + (peer rank 1 contributes 2)
  std::thread killer([&] {
    std::this_thread::sleep_for(milliseconds(300));
    kill(pid, SIGKILL);
  });
  const auto t0 = Clock::now();
  absl::Status s = (*c)->allreduce(data.data(), 100, ReduceOp::kSum, milliseconds(10000));
  killer.join();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Seconds(t0), 10.5);
  std::printf("killed peer -> %s after %.2f s\n", s.ToString().c_str(), Seconds(t0));
  std::filesystem::remove_all(dir);
}

// The peer enters a 64 MiB receive (or allreduce) and is then stopped
// (SIGSTOP): this rank's send is being written when the socket fills up.
// Gloo does not wake such a send when the socket is shut down, so Abort()
// must.
class StalledPeer : public ::testing::TestWithParam<std::string> {};

TEST_P(StalledPeer, AbortEndsAnOperationStuckBehindAPeerThatStoppedReading) {
  signal(SIGPIPE, SIG_IGN);  // as tandem-worker does: writes to the shut-down socket fail with EPIPE
  const std::string mode = GetParam();
  const std::string dir = TempDir("tandem_comm_" + mode);
  pid_t pid = Spawn({PeerBinary(), dir, "1", "2", mode});
  ASSERT_GT(pid, 0);
  FileStore store(dir);
  auto c = MakeCollective("gloo", store, 0, 2, testing::TestOptions(milliseconds(20000)));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> data(100, 1.f);
  ASSERT_TRUE((*c)->allreduce(data.data(), 100, ReduceOp::kSum, milliseconds(20000)).ok());
  const auto wait_start = Clock::now();
  while (!std::filesystem::exists(dir + "/receiving") && Seconds(wait_start) < 20) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(std::filesystem::exists(dir + "/receiving"));
  std::this_thread::sleep_for(milliseconds(500));  // its recv is posted
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::vector<char> payload(size_t{64} << 20, 'x');
  std::vector<float> big(payload.size() / sizeof(float), 1.f);
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(1000));
    (*c)->Abort();
  });
  const auto t0 = Clock::now();
  absl::Status s = mode == "stall" ? (*c)->send(payload.data(), payload.size(), 1, 7, milliseconds(20000))
                                   : (*c)->allreduce(big.data(), big.size(), ReduceOp::kSum, milliseconds(20000));
  const double took = Seconds(t0);
  aborter.join();
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(took, 5.0) << "the abort did not end the send";
  std::printf("%s with a stopped peer -> %s after %.2f s\n", mode.c_str(), s.ToString().c_str(), took);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(SendAndAllreduce, StalledPeer, ::testing::Values("stall", "stall_allreduce"));

}  // namespace
}  // namespace tandem::comm
