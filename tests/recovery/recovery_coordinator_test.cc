// Coordinator recovery paths end to end in-process: an in-process
// coordinator on 127.0.0.1 and fake workers (tests/support) against the
// Cluster service that behave like the engine at the protocol level (SETUP reports
// restored_step for the restore source it is given, CHECKPOINT reports a
// published path and peer_copy). Lost worker -> RECOVERING -> RUNNING with a
// spare or the restarted worker -> SUCCEEDED; corrupt newest checkpoint;
// transient communicator failure; elastic shrink; no replacement; graceful
// preemption. Every wait is bounded.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/checkpoint_path.h"
#include "common/daemon_config.h"
#include "server/coordinator.h"
#include "server/jobs/job_manager.h"
#include "server/recovery/policy.h"
#include "tandem/v1/cluster.grpc.pb.h"
#include "tandem/v1/control.grpc.pb.h"
#include "tests/support/coordinator_harness.h"
#include "tests/support/fake_worker.h"

namespace tandem::server {
namespace {

using tandem::v1::Cluster;
using tandem::v1::Control;

constexpr char kToken[] = "recovery-token";

std::unique_ptr<grpc::ClientContext> Ctx(int ms = 5000) { return test_support::AuthContext(kToken, ms); }

std::string CkptPath(const tandem::v1::JobSpec& spec, int64_t step) {
  return common::CheckpointStepPath(spec.checkpoint().dir(), step);
}

struct Shared {
  absl::Mutex mu;
  std::set<std::string> corrupt ABSL_GUARDED_BY(mu);  // restore from these fails
  std::atomic<bool> live_restore_fails{false};        // SETUP with live_restore fails
  std::atomic<int> phase_sleep_ms{0};                 // every answer takes this long
  // Checkpoints are published by the next FLUSH_CHECKPOINTS, as a real
  // worker's background write is, instead of with their CHECKPOINT report.
  std::atomic<bool> publish_on_flush{false};
};

using Worker = test_support::FakeWorker;

void Fail(tandem::v1::ReportPhaseRequest* report, tandem::v1::PhaseFailureKind kind, const std::string& message) {
  report->set_ok(false);
  report->set_error(message);
  report->mutable_failure()->set_kind(kind);
  report->mutable_failure()->set_message(message);
}

void Restored(tandem::v1::ReportPhaseRequest* report, int64_t step, tandem::v1::RestoreSource source, double seconds) {
  auto* setup = report->mutable_setup();
  setup->set_restored(true);
  setup->set_restored_step(step);
  setup->set_restore_source(source);
  setup->set_restore_seconds(seconds);
}

// Answers like the engine at the protocol level: SETUP reports restored_step
// for the restore source it is given (a checkpoint in shared->corrupt fails
// its checksum), CHECKPOINT reports peer_copy and, on rank 0, the published
// path.
void EngineLikeReport(Shared* shared, Worker& w, const tandem::v1::PhaseCommand& cmd,
                      tandem::v1::ReportPhaseRequest* report) {
  if (shared->phase_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(shared->phase_sleep_ms));
  if (!report->ok()) return;
  if (cmd.phase() == tandem::v1::PHASE_SETUP) {
    const auto& a = cmd.assignment();
    if (a.live_restore()) {
      if (shared->live_restore_fails) {
        Fail(report, tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED,
             absl::StrCat("live restore: rank ", a.rank(), " holds step 99, not ", a.live_restore_step()));
      } else {
        Restored(report, a.live_restore_step(), tandem::v1::RESTORE_SOURCE_LIVE, 0.001);
      }
    } else if (a.peer_restore_step() > 0) {
      Restored(report, a.peer_restore_step(), tandem::v1::RESTORE_SOURCE_PEER, 0.01);
    } else if (!a.restore_from().empty()) {
      bool corrupt;
      {
        absl::MutexLock l(&shared->mu);
        corrupt = shared->corrupt.count(a.restore_from()) > 0;
      }
      if (corrupt) {
        Fail(report, tandem::v1::PHASE_FAILURE_KIND_RESTORE_FAILED,
             absl::StrCat("restore from ", a.restore_from(), ": shard-00000-of-00002.bin: checksum mismatch"));
      } else {
        Restored(report, StepFromCheckpointPath(a.restore_from()), tandem::v1::RESTORE_SOURCE_DISK, 0.02);
      }
    }
  }
  if (cmd.phase() == tandem::v1::PHASE_CHECKPOINT) report->mutable_checkpoint()->set_peer_copy(true);
  const auto publishing =
      shared->publish_on_flush.load() ? tandem::v1::PHASE_FLUSH_CHECKPOINTS : tandem::v1::PHASE_CHECKPOINT;
  if (cmd.phase() == publishing) {
    if (w.last_assignment().rank() == 0) {
      auto* published = report->add_checkpoints();
      published->set_step(cmd.step());
      published->set_path(CkptPath(w.last_assignment().spec(), cmd.step()));
    }
  }
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::FreshTestDir("tandem_recovery");
    config_ = test_support::TestCoordinatorConfig(dir_, kToken, kToken);
    config_.set_lease_ms(800);
    config_.set_heartbeat_ms(100);
    config_.set_phase_timeout_ms(10000);
    config_.set_setup_timeout_ms(10000);
    config_.set_replacement_timeout_ms(5000);
    coordinator_ = std::make_unique<Coordinator>(config_);
    absl::Status s = coordinator_->Start();
    ASSERT_TRUE(s.ok()) << s;
    address_ = coordinator_->grpc_address();
    control_ = Control::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  Worker* AddWorker(const std::string& name) {
    Shared* shared = &shared_;
    workers_.push_back(std::make_unique<Worker>(Worker::Options{
        .name = name,
        .address = [this] { return address_; },
        .token = kToken,
        .fill = [shared](Worker& w, const tandem::v1::PhaseCommand& cmd,
                         tandem::v1::ReportPhaseRequest* report) { EngineLikeReport(shared, w, cmd, report); }}));
    return workers_.back().get();
  }
  tandem::v1::JobSpec Spec(int workers, int steps, int checkpoint_every) {
    tandem::v1::JobSpec spec;
    spec.set_name("r");
    spec.set_kind(tandem::v1::JOB_KIND_SFT);
    spec.mutable_model()->set_from("/models/none");
    spec.mutable_cluster()->set_workers(workers);
    spec.mutable_train()->set_steps(steps);
    spec.mutable_train()->set_global_batch(12);
    spec.mutable_train()->set_micro_batch(2);
    spec.mutable_checkpoint()->set_every(checkpoint_every);
    spec.mutable_checkpoint()->set_keep(3);
    return spec;
  }
  std::string Submit(const tandem::v1::JobSpec& spec) { return test_support::SubmitJob(control_.get(), kToken, spec); }
  tandem::v1::Job GetJob(const std::string& id) { return test_support::GetJob(control_.get(), kToken, id); }
  tandem::v1::Job WaitFor(const std::string& id, std::function<bool(const tandem::v1::Job&)> pred, int ms = 20000) {
    return test_support::WaitForJob(control_.get(), kToken, id, pred, ms, 25);
  }
  static bool Done(const tandem::v1::Job& j) { return IsTerminal(j.state()); }
  std::vector<tandem::v1::JobEvent> Events(const std::string& id) {
    tandem::v1::WatchJobRequest watch;
    watch.set_job_id(id);
    watch.set_from_start(true);
    auto ctx = Ctx(5000);
    auto reader = control_->WatchJob(ctx.get(), watch);
    std::vector<tandem::v1::JobEvent> events;
    tandem::v1::JobEvent e;
    while (reader->Read(&e)) events.push_back(e);
    reader->Finish().ok();
    return events;
  }
  // The "recovered in ..." event (the last one).
  static std::optional<tandem::v1::JobEvent> Recovered(const std::vector<tandem::v1::JobEvent>& events) {
    std::optional<tandem::v1::JobEvent> out;
    for (const auto& e : events) {
      if (e.kind() == "recovery" && absl::StartsWith(e.message(), "recovered in")) out = e;
    }
    return out;
  }
  static bool HasEvent(const std::vector<tandem::v1::JobEvent>& events, const std::string& part) {
    for (const auto& e : events) {
      if (absl::StrContains(e.message(), part)) return true;
    }
    return false;
  }
  static std::string Dump(const std::vector<tandem::v1::JobEvent>& events) {
    std::string s;
    for (const auto& e : events) {
      if (e.kind() != "step") absl::StrAppend(&s, "\n  [", e.kind(), "] ", e.message());
    }
    return s;
  }
  static std::function<bool(const tandem::v1::PhaseCommand&)> StallAt(tandem::v1::Phase phase, int64_t step) {
    return [phase, step](const tandem::v1::PhaseCommand& c) {
      return c.generation() == 1 && c.phase() == phase && c.step() == step;
    };
  }

  std::string dir_;
  tandem::v1::CoordinatorConfig config_;
  std::unique_ptr<Coordinator> coordinator_;
  std::string address_;
  std::unique_ptr<Control::Stub> control_;
  Shared shared_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(RecoveryTest, SpareReplacesLostWorkerFromPeerMemory) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  a->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 4);
  std::string id = Submit(Spec(2, 6, 2));
  WaitFor(id, [](const auto& j) { return j.step() == 3; });
  auto* spare = AddWorker("gamma");
  a->Stop();  // its lease expires
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_EQ(job.step(), 6);
  EXPECT_EQ(job.worker_ids(0), spare->id());
  EXPECT_EQ(job.worker_ids(1), b->id());
  EXPECT_EQ(job.recovery().recoveries(), 1);
  EXPECT_EQ(job.recovery().steps_redone_total(), 1);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from peer memory; resuming at step 3 (1 step redone)"))
      << recovered->message();
  EXPECT_EQ(recovered->metrics().extra().at("restore_source"), 1);
  EXPECT_GT(recovered->metrics().extra().at("detect_seconds"), 0.5);  // the lease (0.8 s)
  EXPECT_TRUE(HasEvent(events, "lost: lease expired")) << Dump(events);
  // The spare received its shard from rank 1 and redid steps 3 and 4.
  const auto assignment = spare->last_assignment();
  EXPECT_EQ(assignment.peer_restore_step(), 2);
  ASSERT_EQ(assignment.peer_restore_ranks_size(), 1);
  EXPECT_EQ(assignment.peer_restore_ranks(0), 0);
  auto phases = spare->phases();
  ASSERT_GE(phases.size(), 3u);
  EXPECT_EQ(phases[0], "PHASE_SETUP(0)");
  EXPECT_EQ(phases[1], "PHASE_SFT_STEP(3)");
  EXPECT_EQ(phases.back(), "PHASE_TEARDOWN(6)");
  // Checkpoint records: ListCheckpoints.
  tandem::v1::ListCheckpointsRequest lc;
  lc.set_job_id(id);
  tandem::v1::ListCheckpointsResponse records;
  ASSERT_TRUE(control_->ListCheckpoints(Ctx().get(), lc, &records).ok());
  std::set<int64_t> steps;
  for (const auto& r : records.checkpoints()) steps.insert(r.step());
  EXPECT_EQ(steps, (std::set<int64_t>{2, 4, 6}));
}

TEST_F(RecoveryTest, RestartedWorkerTakesItsRankBackFromDisk) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 4);
  auto spec = Spec(2, 5, 2);
  spec.mutable_recovery()->set_no_peer_copies(true);
  std::string id = Submit(spec);
  WaitFor(id, [](const auto& j) { return j.step() == 3; });
  const std::string old_id = b->id();
  b->Stop();
  // The coordinator has seen beta go before it comes back.
  WaitFor(id, [](const auto& j) { return j.state() == tandem::v1::JOB_STATE_RECOVERING; });
  auto* b2 = AddWorker("beta");  // restarted by its supervisor: same name, fresh state
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(b2->id(), old_id);
  EXPECT_EQ(job.worker_ids(1), old_id);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from disk; resuming at step 3")) << recovered->message();
  EXPECT_EQ(b2->last_assignment().restore_from(), CkptPath(GetJob(id).spec(), 2));
  EXPECT_EQ(b2->last_assignment().peer_restore_step(), 0);
}

// A checkpoint whose restore kills the worker (it never reports): after the
// second worker lost restoring it, it is marked bad and the previous one
// is used.
TEST_F(RecoveryTest, CheckpointWhoseRestoreKillsWorkersIsMarkedBad) {
  // Four workers for a job of two: whoever is rank 1 fails step 5 with a
  // communicator error in generation 1, and dies (stops answering and
  // heartbeating) restoring step 4's checkpoint.
  for (const char* name : {"alpha", "beta", "gamma", "delta"}) {
    Worker* w = AddWorker(name);
    w->fail = [w](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
      failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
      failure->set_message("gloo: allreduce failed: Connection reset by peer");
      return c.generation() == 1 && c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 5 &&
             w->last_assignment().rank() == 1;
    };
    w->stall = [w](const tandem::v1::PhaseCommand& c) {
      if (c.phase() != tandem::v1::PHASE_SETUP || !absl::EndsWith(c.assignment().restore_from(), "/step-00000004") ||
          c.assignment().rank() != 1) {
        return false;
      }
      w->heartbeats_on = false;
      return true;
    };
  }
  auto spec = Spec(2, 6, 2);
  spec.mutable_recovery()->set_no_peer_copies(true);
  spec.mutable_recovery()->set_max_recoveries(5);
  std::string id = Submit(spec);
  const std::string poison = CkptPath(GetJob(id).spec(), 4);
  auto job = WaitFor(id, Done, 40000);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_TRUE(
      HasEvent(events, absl::StrCat("checkpoint ", poison, " is unusable (2 workers were lost while restoring it)")))
      << Dump(events);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "resuming at step 3")) << recovered->message();
}

TEST_F(RecoveryTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    failure->set_message("gloo: allreduce failed: Connection reset by peer");
    return c.generation() == 1 && c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 5;
  };
  auto spec = Spec(2, 6, 2);
  spec.mutable_recovery()->set_no_peer_copies(true);
  std::string id = Submit(spec);
  {
    absl::MutexLock l(&shared_.mu);
    shared_.corrupt.insert(CkptPath(GetJob(id).spec(), 4));
  }
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_TRUE(HasEvent(events, absl::StrCat("checkpoint ", CkptPath(GetJob(id).spec(), 4), " is unusable")))
      << Dump(events);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from disk; resuming at step 3 (2 steps redone)"))
      << recovered->message();
  EXPECT_EQ(job.generation(), 3);  // one attempt with step 4, one with step 2
}

TEST_F(RecoveryTest, TransientCommunicatorFailureRecoversInPlaceFromOwnCopies) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  a->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    failure->set_message("gloo: allreduce timed out");
    return c.generation() == 1 && c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 3;
  };
  std::string id = Submit(Spec(2, 4, 2));
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(job.worker_ids(0), a->id());
  EXPECT_EQ(job.worker_ids(1), b->id());
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from peer memory; resuming at step 3 (0 steps redone)"))
      << recovered->message();
  EXPECT_EQ(a->last_assignment().peer_restore_ranks_size(), 0);
}

// The coordinator acts on the reported kind, not on the words of the message.
TEST_F(RecoveryTest, FatalFailureFailsTheJobWhateverItsMessageSays) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_FATAL);
    failure->set_message("gloo: allreduce failed: Connection reset by peer");
    return c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 2;
  };
  std::string id = Submit(Spec(2, 4, 1));
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED) << Dump(events);
  EXPECT_EQ(job.generation(), 1);
  EXPECT_FALSE(HasEvent(events, "recovering")) << Dump(events);
}

TEST_F(RecoveryTest, RetryableFailureRecoversWhateverItsMessageSays) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
    failure->set_message("boom");
    return c.generation() == 1 && c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 2;
  };
  std::string id = Submit(Spec(2, 4, 1));
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(job.generation(), 2);
  EXPECT_TRUE(HasEvent(events, "failed on worker")) << Dump(events);
}

// Only a RESTORE_FAILED SETUP marks its checkpoint bad: a SETUP that fails
// for another reason while restoring fails the job and keeps the checkpoint.
TEST_F(RecoveryTest, OnlyARestoreFailureMarksTheCheckpointBad) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    if (c.generation() == 1) {
      failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
      failure->set_message("collective aborted");
      return c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 3;
    }
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_FATAL);
    failure->set_message("restore from the checkpoint: this worker's model code is out of date");
    return c.phase() == tandem::v1::PHASE_SETUP;
  };
  auto spec = Spec(2, 4, 2);
  spec.mutable_recovery()->set_no_peer_copies(true);
  std::string id = Submit(spec);
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED) << Dump(events);
  EXPECT_TRUE(absl::StrContains(job.reason(), "model code is out of date")) << job.reason();
  EXPECT_FALSE(HasEvent(events, "is unusable")) << Dump(events);
  EXPECT_EQ(job.generation(), 2);
}

TEST_F(RecoveryTest, ElasticJobContinuesWithFewerRanks) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  AddWorker("gamma");
  b->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 3);
  auto spec = Spec(3, 4, 1);
  spec.mutable_cluster()->set_min_workers(2);
  spec.mutable_recovery()->set_replacement_timeout_ms(500);
  std::string id = Submit(spec);
  WaitFor(id, [](const auto& j) { return j.step() == 2; });
  b->Stop();
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(job.worker_ids_size(), 2);
  EXPECT_TRUE(HasEvent(events, "elastic: 2 of 3 ranks")) << Dump(events);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  // The world changed: the copies in memory do not fit, the disk one reshards.
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from disk; resuming at step 3")) << recovered->message();
  EXPECT_EQ(recovered->metrics().extra().at("world_size"), 2);
}

TEST_F(RecoveryTest, NoReplacementFailsWithAClearReason) {
  auto* a = AddWorker("alpha");
  AddWorker("beta");
  a->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 2);
  auto spec = Spec(2, 3, 0);
  spec.mutable_recovery()->set_replacement_timeout_ms(300);
  std::string id = Submit(spec);
  WaitFor(id, [](const auto& j) { return j.step() == 1; });
  a->Stop();
  auto job = WaitFor(id, Done);
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(job.reason(), "rank 0 lost: lease expired")) << job.reason();
  EXPECT_TRUE(absl::StrContains(job.reason(), "no replacement worker within 300ms (1 of 2 workers left"))
      << job.reason();
}

TEST_F(RecoveryTest, PreemptedWorkerIsHandedOverAfterACheckpoint) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  // Slow steps so that the preemption lands mid-job.
  auto slow = [](const tandem::v1::PhaseCommand& c) {
    if (c.phase() == tandem::v1::PHASE_SFT_STEP) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return false;
  };
  a->stall = slow;
  b->stall = slow;
  shared_.publish_on_flush = true;
  std::string id = Submit(Spec(2, 10, 0));
  WaitFor(id, [](const auto& j) { return j.step() >= 2; });
  auto* spare = AddWorker("gamma");
  ASSERT_TRUE(test_support::WaitForWorker(control_.get(), kToken, "gamma", tandem::v1::WORKER_STATE_IDLE, 10000, 25));
  b->preempting = true;  // SIGTERM on beta
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_EQ(job.worker_ids(1), spare->id());
  EXPECT_TRUE(HasEvent(events, "being preempted")) << Dump(events);
  EXPECT_TRUE(HasEvent(events, "before handing over preempted worker")) << Dump(events);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from peer memory")) << recovered->message();
  EXPECT_TRUE(absl::StrContains(recovered->message(), "(0 steps redone)")) << recovered->message();
  for (int i = 0; i < 40 && !b->released; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(b->released);
  // The preemption's checkpoint reached the disk before the handover (the
  // peer copy leaves with the workers when all of them are preempted): beta's
  // last phases are that CHECKPOINT and then a FLUSH_CHECKPOINTS of its step,
  // which publishes it.
  auto phases = b->phases();
  ASSERT_GE(phases.size(), 2u);
  const std::string& checkpoint = phases[phases.size() - 2];
  const std::string& flush = phases.back();
  EXPECT_TRUE(absl::StartsWith(checkpoint, "PHASE_CHECKPOINT(")) << absl::StrJoin(phases, " ");
  EXPECT_EQ(flush, absl::StrCat("PHASE_FLUSH_CHECKPOINTS", checkpoint.substr(checkpoint.find('('))))
      << absl::StrJoin(phases, " ");
}

// Degraded continuation (recovery.degraded, ZeRO-0): no wait for a
// replacement, no rollback; the survivor before the lost rank computes its
// data share. A spare that registers later makes the job grow back to full
// size from a checkpoint of the current step.
TEST_F(RecoveryTest, DegradedJobContinuesAtOnceAndGrowsBack) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  auto* c = AddWorker("gamma");
  b->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 5);
  shared_.phase_sleep_ms = 20;
  auto spec = Spec(3, 14, 4);
  spec.mutable_cluster()->set_zero_stage(0);
  spec.mutable_recovery()->set_degraded(true);
  spec.mutable_recovery()->set_replacement_timeout_ms(60000);  // never waited for
  std::string id = Submit(spec);
  WaitFor(id, [](const auto& j) { return j.step() == 4; });
  b->Stop();
  auto degraded = WaitFor(id, [](const auto& j) {
    return j.recovery().degraded_logical_world() == 3 && j.state() == tandem::v1::JOB_STATE_RUNNING;
  });
  ASSERT_EQ(degraded.worker_ids_size(), 2) << degraded.DebugString();
  EXPECT_EQ(degraded.worker_ids(0), a->id());
  EXPECT_EQ(degraded.worker_ids(1), c->id());
  // alpha computes shares 0-1 (its own and beta's), gamma share 2.
  // alpha and gamma finished step 5 (only beta stalled in it): they keep it.
  const auto aa = a->last_assignment();
  EXPECT_TRUE(aa.live_restore());
  EXPECT_EQ(aa.live_restore_step(), 5);
  EXPECT_EQ(aa.world_size(), 2);
  EXPECT_EQ(aa.logical_world_size(), 3);
  EXPECT_EQ(aa.logical_rank_begin(), 0);
  EXPECT_EQ(aa.logical_rank_end(), 2);
  EXPECT_EQ(aa.own_logical_rank(), 0);
  const auto ca = c->last_assignment();
  EXPECT_EQ(ca.logical_rank_begin(), 2);
  EXPECT_EQ(ca.logical_rank_end(), 3);
  EXPECT_EQ(ca.own_logical_rank(), 2);
  auto* spare = AddWorker("delta");
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_TRUE(HasEvent(events, "degraded: generation 2 continues on 2 of 3 ranks without waiting")) << Dump(events);
  EXPECT_TRUE(HasEvent(events, "from live memory; resuming at step 6 (0 steps redone)")) << Dump(events);
  EXPECT_TRUE(HasEvent(events, "growing back to 3 of 3 ranks (degraded mode ends)")) << Dump(events);
  EXPECT_EQ(job.worker_ids_size(), 3);
  EXPECT_EQ(job.worker_ids(2), spare->id());
  EXPECT_EQ(job.recovery().grow_backs(), 1);
  EXPECT_EQ(job.recovery().degraded_logical_world(), 0);
  EXPECT_EQ(job.recovery().steps_redone_total(), 0);
  // The grown-back generation restored a checkpoint of the step it stopped at.
  const auto sa = spare->last_assignment();
  EXPECT_EQ(sa.world_size(), 3);
  EXPECT_EQ(sa.logical_world_size(), 0);
  EXPECT_FALSE(sa.live_restore());
  EXPECT_FALSE(sa.restore_from().empty());
  EXPECT_EQ(job.step(), 14);
}

TEST_F(RecoveryTest, DegradedLiveRestoreFailureFallsBackToDisk) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->stall = StallAt(tandem::v1::PHASE_SFT_STEP, 4);
  shared_.live_restore_fails = true;
  auto spec = Spec(2, 6, 2);
  spec.mutable_cluster()->set_zero_stage(0);
  spec.mutable_recovery()->set_degraded(true);
  std::string id = Submit(spec);
  WaitFor(id, [](const auto& j) { return j.step() == 3; });
  b->Stop();
  auto job = WaitFor(id, Done);
  auto events = Events(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason() << Dump(events);
  EXPECT_TRUE(HasEvent(events, "live-state restore failed")) << Dump(events);
  auto recovered = Recovered(events);
  ASSERT_TRUE(recovered) << Dump(events);
  EXPECT_TRUE(absl::StrContains(recovered->message(), "from disk; resuming at step 3")) << recovered->message();
  EXPECT_EQ(job.worker_ids_size(), 1);  // still degraded: no spare came
  EXPECT_EQ(job.recovery().degraded_logical_world(), 2);
}

}  // namespace
}  // namespace tandem::server
