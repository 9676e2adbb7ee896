// Job isolation in the coordinator: one job's trouble with the state store
// or its own lock never stalls another job's reports.
// - A SQLite write of job A that does not commit (held on the store's writer
//   thread, inside the batch's transaction where the commit would write):
//   job B's ReportPhase is answered and B's record, events and the job list
//   are read meanwhile; B goes on once the write commits.
// - The store's fsync (the WAL checkpoint) does not return: another job is
//   submitted, scheduled, takes its workers' reports, advances phase by
//   phase and finishes, and job A goes on.
// - Job A's driver is stuck under its lock: the reaper still hands a lost
//   worker of job B over, and B recovers onto a spare.
// Every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/coordinator.h"
#include "server/jobs/job_manager.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.grpc.pb.h"
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

// Holds the commit of every store batch with one job's records until
// released (bounded); called on the store's writer thread.
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

// Holds once, until released (bounded): stands for a slow disk.
class Gate {
 public:
  void Hold() {
    if (!held_.HasBeenNotified()) held_.Notify();
    release_.WaitForNotificationWithTimeout(absl::Seconds(60));
  }
  bool WaitHeld() { return held_.WaitForNotificationWithTimeout(absl::Seconds(20)); }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  bool released() const { return release_.HasBeenNotified(); }

 private:
  absl::Notification held_;
  absl::Notification release_;
};

class JobIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::FreshTestDir("tandem_isolation");
    auto config = test_support::TestCoordinatorConfig(dir_, kToken, kToken);
    config.set_heartbeat_ms(100);
    config.set_lease_ms(lease_ms_);
    config.set_phase_timeout_ms(60000);
    config.set_replacement_timeout_ms(20000);
    coordinator_ = std::make_unique<Coordinator>(config);
    ASSERT_TRUE(coordinator_->Start().ok());
    address_ = coordinator_->grpc_address();
    control_ = tandem::v1::Control::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    cluster_ = tandem::v1::Cluster::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    // Released before the coordinator (whose threads they hold) goes.
    latch_.Release();
    gate_.Release();
    coordinator_->store_for_test()->SetWriteHookForTest(nullptr);
    coordinator_->store_for_test()->SetCheckpointHookForTest(nullptr);
    workers_.clear();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  // A command one of the workers keeps for the test to answer.
  struct Kept {
    absl::Mutex mu;
    std::string job_id ABSL_GUARDED_BY(mu);
    std::optional<tandem::v1::PhaseCommand> command ABSL_GUARDED_BY(mu);
    test_support::FakeWorker* by ABSL_GUARDED_BY(mu) = nullptr;
    absl::Notification got;
  };

  test_support::FakeWorker* AddWorker(const std::string& name) {
    workers_.push_back(std::make_unique<test_support::FakeWorker>(
        test_support::FakeWorker::Options{.name = name, .address = [this] { return address_; }, .token = kToken}));
    return workers_.back().get();
  }
  tandem::v1::Job WaitFor(const std::string& id, std::function<bool(const tandem::v1::Job&)> pred) {
    return test_support::WaitForJob(control_.get(), kToken, id, pred, 30000, 20);
  }
  test_support::FakeWorker* WorkerWithId(const std::string& id) {
    for (auto& w : workers_) {
      if (w->id() == id) return w.get();
    }
    return nullptr;
  }
  void CancelAndWait(const std::string& id) {
    coordinator_->jobs()->Cancel(id, "test over").IgnoreError();
    WaitFor(id, [](const auto& j) { return IsTerminal(j.state()); });
  }

  int64_t lease_ms_ = 5000;
  std::string dir_;
  WriteLatch latch_;
  Gate gate_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string address_;
  std::unique_ptr<tandem::v1::Control::Stub> control_;
  std::unique_ptr<tandem::v1::Cluster::Stub> cluster_;
  Kept kept_;  // read by the workers' threads: outlives them
  std::vector<std::unique_ptr<test_support::FakeWorker>> workers_;
};

TEST_F(JobIsolationTest, AHeldSqliteWriteLeavesAnotherJobsReportsPrompt) {
  StateStore* store = coordinator_->store_for_test();
  store->SetWriteHookForTest([this](const std::string& id) { latch_.OnWrite(id); });
  // Job B's command of step 2 is kept for the test to answer itself.
  Kept* kept = &kept_;
  for (const char* name : {"alpha", "beta"}) {
    auto* w = AddWorker(name);
    w->stall = [kept, w](const tandem::v1::PhaseCommand& cmd) {
      absl::MutexLock lock(&kept->mu);
      if (kept->job_id.empty() || cmd.job_id() != kept->job_id || cmd.phase() != tandem::v1::PHASE_SFT_STEP ||
          cmd.step() != 2 || kept->command) {
        return false;
      }
      kept->command = cmd;
      kept->by = w;
      kept->got.Notify();
      return true;
    };
  }
  const std::string a = test_support::SubmitJob(control_.get(), kToken, SftSpec("a", 100000));
  ASSERT_FALSE(a.empty());
  WaitFor(a, [](const auto& j) { return j.step() >= 1; });
  const std::string b = test_support::SubmitJob(control_.get(), kToken, SftSpec("b", 4));
  ASSERT_FALSE(b.empty());
  {
    absl::MutexLock lock(&kept->mu);
    kept->job_id = b;  // B's step 2 comes after its setup and step 1
  }
  ASSERT_TRUE(kept->got.WaitForNotificationWithTimeout(absl::Seconds(30))) << "job B never reached step 2";

  // A's next write is held inside the store's transaction: nothing commits.
  latch_.Arm(a);
  ASSERT_TRUE(latch_.WaitHeld()) << "job A never wrote again";
  const WriteTicket held_through = store->DurableThrough();

  // B's worker reports step 2: the report is taken and answered (its log
  // lines and the cursor are queued behind A's write).
  tandem::v1::ReportPhaseRequest report;
  test_support::FakeWorker* kept_by = nullptr;
  {
    absl::MutexLock lock(&kept->mu);
    kept_by = kept->by;
    report.set_worker_id(kept_by->id());
    report.set_command_id(kept->command->command_id());
    report.set_job_id(kept->command->job_id());
    report.set_generation(kept->command->generation());
    report.set_phase(kept->command->phase());
    report.set_step(kept->command->step());
  }
  report.set_ok(true);
  report.set_seconds(0.001);
  report.add_log_lines("beta ran PHASE_SFT_STEP");
  tandem::v1::ReportPhaseResponse response;
  grpc::Status answered = cluster_->ReportPhase(kept_by->WorkerContext(30000).get(), report, &response);
  ASSERT_TRUE(answered.ok()) << answered.error_message();
  // A duplicate (a worker sending again) is answered too.
  answered = cluster_->ReportPhase(kept_by->WorkerContext(30000).get(), report, &response);
  ASSERT_TRUE(answered.ok()) << answered.error_message();
  // Reads do not wait for the writer.
  auto job_b = coordinator_->jobs()->Get(b);
  ASSERT_TRUE(job_b.ok());
  EXPECT_EQ(job_b->state(), tandem::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(coordinator_->jobs()->List(tandem::v1::JOB_STATE_UNSPECIFIED, 10).size(), 2u);
  EXPECT_TRUE(coordinator_->jobs()->Logs(b, 0, 100).ok());
  EXPECT_TRUE(store->ListEvents(b, 0, 100).ok());
  // Nothing committed meanwhile: the write was truly held.
  EXPECT_EQ(store->DurableThrough(), held_through);
  EXPECT_FALSE(latch_.released());

  // Released, both go on; B to the end.
  latch_.Release();
  auto done_b = WaitFor(b, [](const auto& j) { return IsTerminal(j.state()); });
  EXPECT_EQ(done_b.state(), tandem::v1::JOB_STATE_SUCCEEDED) << done_b.reason();
  EXPECT_EQ(done_b.step(), 4);
  CancelAndWait(a);
}

TEST_F(JobIsolationTest, AHeldFsyncHoldsNoJob) {
  StateStore* store = coordinator_->store_for_test();
  AddWorker("alpha");
  AddWorker("beta");
  const std::string a = test_support::SubmitJob(control_.get(), kToken, SftSpec("a", 100000));
  ASSERT_FALSE(a.empty());
  WaitFor(a, [](const auto& j) { return j.step() >= 1; });

  // The checkpointer (where SQLite fsyncs) is held.
  store->SetCheckpointHookForTest([this] { gate_.Hold(); });
  const int64_t checkpoints = store->CheckpointsForTest();
  store->RequestCheckpoint();
  ASSERT_TRUE(gate_.WaitHeld());

  // Job B is submitted, scheduled on the other worker and runs to the end,
  // and A advances, while the fsync is held.
  const std::string b = test_support::SubmitJob(control_.get(), kToken, SftSpec("b", 3));
  ASSERT_FALSE(b.empty());
  auto job_b = WaitFor(b, [](const auto& j) { return IsTerminal(j.state()); });
  EXPECT_EQ(job_b.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job_b.reason();
  EXPECT_EQ(job_b.step(), 3);
  const int64_t step_a = test_support::GetJob(control_.get(), kToken, a).step();
  auto job_a = WaitFor(a, [step_a](const auto& j) { return j.step() > step_a; });
  EXPECT_GT(job_a.step(), step_a);
  EXPECT_FALSE(gate_.released());
  EXPECT_EQ(store->CheckpointsForTest(), checkpoints);

  gate_.Release();
  CancelAndWait(a);
}

class ReaperIsolationTest : public JobIsolationTest {
 protected:
  void SetUp() override {
    lease_ms_ = 800;
    JobIsolationTest::SetUp();
  }
};

TEST_F(ReaperIsolationTest, ALostWorkerIsHandedOverWhileAnotherJobsDriverIsStuck) {
  AddWorker("alpha");
  AddWorker("beta");
  const std::string a = test_support::SubmitJob(control_.get(), kToken, SftSpec("a", 100000));
  ASSERT_FALSE(a.empty());
  WaitFor(a, [](const auto& j) { return j.step() >= 1; });
  const std::string b = test_support::SubmitJob(control_.get(), kToken, SftSpec("b", 100000));
  ASSERT_FALSE(b.empty());
  auto running_b = WaitFor(b, [](const auto& j) { return j.step() >= 1; });
  ASSERT_EQ(running_b.worker_ids_size(), 1);
  const auto running_a = test_support::GetJob(control_.get(), kToken, a);
  ASSERT_EQ(running_a.worker_ids_size(), 1);

  // A's driver is stuck under its lock.
  auto driver_a = coordinator_->jobs()->DriverForTest(a);
  ASSERT_NE(driver_a, nullptr);
  absl::Notification held, release;
  std::thread holder([&] { driver_a->HoldLockForTest(&held, &release); });
  struct ReleaseAtExit {
    absl::Notification* release;
    std::thread* holder;
    ~ReleaseAtExit() {
      if (!release->HasBeenNotified()) release->Notify();
      holder->join();
    }
  } release_at_exit{&release, &holder};
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(20)));

  // Both jobs lose their worker; a spare registers.
  auto* worker_a = WorkerWithId(running_a.worker_ids(0));
  auto* worker_b = WorkerWithId(running_b.worker_ids(0));
  ASSERT_NE(worker_a, nullptr);
  ASSERT_NE(worker_b, nullptr);
  worker_a->Stop();
  worker_b->Stop();
  auto* spare = AddWorker("gamma");

  // B recovers onto the spare while A's driver is still stuck.
  auto recovered_b = WaitFor(
      b, [](const auto& j) { return j.recovery().recoveries() >= 1 && j.state() == tandem::v1::JOB_STATE_RUNNING; });
  EXPECT_EQ(recovered_b.state(), tandem::v1::JOB_STATE_RUNNING) << recovered_b.reason();
  ASSERT_EQ(recovered_b.worker_ids_size(), 1);
  EXPECT_EQ(recovered_b.worker_ids(0), spare->id());
  // A's loss waits in A's inbox.
  EXPECT_FALSE(release.HasBeenNotified());
  EXPECT_EQ(driver_a->InboxSizeForTest(), 1u);

  release.Notify();
  // A takes its loss: it recovers (and waits for a worker).
  WaitFor(a, [](const auto& j) { return j.state() == tandem::v1::JOB_STATE_RECOVERING || IsTerminal(j.state()); });
  EXPECT_EQ(driver_a->InboxSizeForTest(), 0u);
  CancelAndWait(a);
  CancelAndWait(b);
}

}  // namespace
}  // namespace tandem::server
