// The test-cluster launcher (tests/support/cluster.py) driven from C++
// (tests/support/real_cluster.h), against real processes: a coordinator and
// two workers come up IDLE, a worker killed with SIGKILL is LOST and exits
// 137, started again it is IDLE under the same name, and the coordinator
// killed and started again serves on the same port with its workers back.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <unistd.h>

#include <filesystem>
#include <map>

#include "tandem/v1/control.grpc.pb.h"
#include "tests/support/fake_worker.h"
#include "tests/support/real_cluster.h"

namespace tandem::test_support {
namespace {

std::map<std::string, tandem::v1::WorkerState> ListWorkers(RealCluster& c) {
  auto stub = tandem::v1::Control::NewStub(grpc::CreateChannel(c.grpc_address(), grpc::InsecureChannelCredentials()));
  tandem::v1::ListWorkersResponse resp;
  auto st = stub->ListWorkers(AuthContext(c.admin_token()).get(), tandem::v1::ListWorkersRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  std::map<std::string, tandem::v1::WorkerState> out;
  for (const auto& w : resp.workers()) out[w.name()] = w.state();
  return out;
}

TEST(Launcher, StartsKillsAndRestartsMembers) {
  RealClusterOptions o;
  o.dir = ::testing::TempDir() + "/launcher_test_" + std::to_string(getpid());
  std::filesystem::remove_all(o.dir);
  o.bin_dir = TANDEM_BIN_DIR;
  o.launcher = TANDEM_SOURCE_DIR "/tests/support/cluster.py";
  o.workers = 2;
  o.coordinator_args = {"--lease-ms", "1000", "--heartbeat-ms", "200"};
  auto c = RealCluster::Up(o);
  ASSERT_TRUE(c.ok()) << c.status();
  RealCluster& cluster = **c;

  // The description: ports, pids, logs.
  const auto& d = cluster.description();
  EXPECT_NE(cluster.grpc_address().find("127.0.0.1:"), std::string::npos);
  EXPECT_NE(cluster.metrics_address().find("127.0.0.1:"), std::string::npos);
  for (const char* m : {"coordinator", "w0", "w1"}) {
    ASSERT_TRUE(d["members"].contains(m)) << d.dump();
    EXPECT_GT(cluster.Pid(m), 0) << m;
    EXPECT_TRUE(std::filesystem::exists(d["members"][m]["log"].get<std::string>())) << m;
  }
  auto workers = ListWorkers(cluster);
  EXPECT_EQ(workers["w0"], tandem::v1::WORKER_STATE_IDLE);
  EXPECT_EQ(workers["w1"], tandem::v1::WORKER_STATE_IDLE);

  // A worker killed: exit 128+9, LOST once its lease ran out; started again, IDLE.
  const int old_pid = cluster.Pid("w1");
  auto code = cluster.Kill("w1", SIGKILL);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + SIGKILL);
  ASSERT_TRUE(cluster.WaitWorkers({"w1"}, "LOST").ok());
  ASSERT_TRUE(cluster.Restart("w1", /*wait=*/true).ok());
  EXPECT_NE(cluster.Pid("w1"), old_pid);
  EXPECT_EQ(ListWorkers(cluster)["w1"], tandem::v1::WORKER_STATE_IDLE);

  // The coordinator killed and started again: the same gRPC port, both workers back.
  const std::string grpc = cluster.grpc_address();
  code = cluster.Kill("coordinator", SIGKILL);
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_TRUE(cluster.Restart("coordinator", /*wait=*/false).ok());
  EXPECT_EQ(cluster.grpc_address(), grpc);
  auto back = cluster.WaitWorkers({"w0", "w1"}, "IDLE");
  EXPECT_TRUE(back.ok()) << back;

  // Down: every member ended (TERM: 128+15, or 0 for a clean drain).
  ASSERT_TRUE(cluster.Down().ok());
  for (const char* m : {"coordinator", "w0", "w1"}) {
    EXPECT_FALSE(cluster.description()["members"][m]["exit"].is_null()) << m;
  }
}

TEST(Launcher, ReportsAMemberThatCannotStart) {
  RealClusterOptions o;
  o.dir = ::testing::TempDir() + "/launcher_bad_" + std::to_string(getpid());
  std::filesystem::remove_all(o.dir);
  o.bin_dir = TANDEM_BIN_DIR;
  o.launcher = TANDEM_SOURCE_DIR "/tests/support/cluster.py";
  o.workers = 0;
  o.coordinator_args = {"--no-such-flag"};
  o.timeout_s = 20;
  auto c = RealCluster::Up(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("coordinator exited during start-up"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace tandem::test_support
