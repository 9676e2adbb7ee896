// Job isolation in the coordinator: a state-store write of one job that
// does not return (a slow disk, stood for by the store's write hook) holds
// only that job's lock. Meanwhile another job is submitted, scheduled, takes
// its workers' reports, advances phase by phase and finishes, and listing
// jobs answers. Every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/coordinator.h"
#include "server/jobs/job_manager.h"
#include "server/store/state_store.h"
#include "tandem/v1/control.grpc.pb.h"
#include "tests/support/coordinator_harness.h"
#include "tests/support/fake_worker.h"

namespace tandem::server {
namespace {

constexpr char kToken[] = "isolation-token";

tandem::v1::JobSpec SftSpec(const std::string& name, int steps) {
  tandem::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_model()->set_from("/models/none");
  spec.mutable_cluster()->set_workers(1);
  spec.mutable_train()->set_steps(steps);
  spec.mutable_train()->set_global_batch(2);
  spec.mutable_train()->set_micro_batch(2);
  return spec;
}

// Holds every write of one job's records until released (bounded).
class WriteLatch {
 public:
  void Arm(const std::string& job_id) {
    job_id_ = job_id;
    armed_ = true;
  }
  void OnWrite(const std::string& job_id) {
    if (!armed_ || job_id != job_id_) return;
    if (!held_.exchange(true)) first_held_.Notify();
    release_.WaitForNotificationWithTimeout(absl::Seconds(60));
  }
  bool WaitHeld() { return first_held_.WaitForNotificationWithTimeout(absl::Seconds(20)); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  bool released() const { return release_.HasBeenNotified(); }

 private:
  std::string job_id_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> held_{false};
  absl::Notification first_held_;
  absl::Notification release_;
};

TEST(JobIsolationTest, AHeldWriteOfOneJobDoesNotBlockAnotherJobsReports) {
  const std::string dir = test_support::FreshTestDir("tandem_isolation");
  WriteLatch latch;  // outlives the coordinator, whose store calls it
  auto config = test_support::TestCoordinatorConfig(dir, kToken, kToken);
  config.set_heartbeat_ms(100);
  config.set_lease_ms(5000);
  config.set_phase_timeout_ms(60000);
  auto coordinator = std::make_unique<Coordinator>(config);
  ASSERT_TRUE(coordinator->Start().ok());
  const std::string address = coordinator->grpc_address();
  auto control = tandem::v1::Control::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  // Released on every way out, before the coordinator is torn down.
  struct ReleaseAtExit {
    WriteLatch* latch;
    ~ReleaseAtExit() { latch->Release(); }
  } release_at_exit{&latch};
  coordinator->store_for_test()->SetWriteHookForTest([&latch](const std::string& id) { latch.OnWrite(id); });
  std::vector<std::unique_ptr<test_support::FakeWorker>> workers;
  for (const char* name : {"alpha", "beta"}) {
    workers.push_back(std::make_unique<test_support::FakeWorker>(
        test_support::FakeWorker::Options{.name = name, .address = [address] { return address; }, .token = kToken}));
  }

  // Job A runs; then its next write (a report's log lines, an event or the
  // cursor after a phase) is held, with A's driver lock taken.
  const std::string a = test_support::SubmitJob(control.get(), kToken, SftSpec("a", 100000));
  ASSERT_FALSE(a.empty());
  test_support::WaitForJob(
      control.get(), kToken, a, [](const auto& j) { return j.step() >= 1; }, 20000, 20);
  latch.Arm(a);
  ASSERT_TRUE(latch.WaitHeld()) << "job A never wrote again";

  // Job B is submitted, scheduled on the other worker and runs to the end
  // while A's write is held.
  const std::string b = test_support::SubmitJob(control.get(), kToken, SftSpec("b", 3));
  ASSERT_FALSE(b.empty());
  auto job_b = test_support::WaitForJob(
      control.get(), kToken, b, [](const auto& j) { return IsTerminal(j.state()); }, 30000, 20);
  EXPECT_EQ(job_b.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job_b.reason();
  EXPECT_EQ(job_b.step(), 3);
  EXPECT_FALSE(latch.released());
  // Reads of other jobs, and the list, do not wait for A's lock.
  EXPECT_EQ(coordinator->jobs()->List(tandem::v1::JOB_STATE_UNSPECIFIED, 10).size(), 2u);
  auto held_a = coordinator->jobs()->Get(a);
  ASSERT_TRUE(held_a.ok());
  EXPECT_EQ(held_a->state(), tandem::v1::JOB_STATE_RUNNING);

  // Released, A goes on.
  const int64_t step_a = held_a->step();
  latch.Release();
  auto job_a = test_support::WaitForJob(
      control.get(), kToken, a, [step_a](const auto& j) { return j.step() > step_a; }, 20000, 20);
  EXPECT_GT(job_a.step(), step_a);
  ASSERT_TRUE(coordinator->jobs()->Cancel(a, "test over").ok());
  test_support::WaitForJob(
      control.get(), kToken, a, [](const auto& j) { return IsTerminal(j.state()); }, 20000, 20);
  workers.clear();
  coordinator.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::server
