// JobEngine::Abort() during a SETUP in progress: a rank whose peer
// never joins the rendezvous is blocked in SETUP (collective timeout 30 s);
// Abort() from another thread (abort_job, the daemon's shutdown) must make it
// return Aborted within 1 s, and the engine must set up normally afterwards.
#include <chrono>
#include <thread>

#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

using Clock = std::chrono::steady_clock;

TEST(SetupAbortTest, AbortEndsASetupWaitingForAMissingPeer) {
  EngineCluster cluster(2, "job-abort");
  const JobSpec spec = ParseSpec(TinySftYaml(), {"cluster.workers=2"});
  tandem::v1::PhaseCommand cmd;
  cmd.set_command_id("setup-alone");
  cmd.set_job_id("job-abort");
  cmd.set_generation(1000);  // a scope of its own in the shared store
  cmd.set_phase(tandem::v1::PHASE_SETUP);
  auto* a = cmd.mutable_assignment();
  a->set_job_id("job-abort");
  *a->mutable_spec() = spec;
  a->set_rank(0);
  a->set_world_size(2);
  a->set_generation(1000);

  Clock::time_point fired_at;
  bool in_rendezvous = false;
  std::thread aborter([&] {
    // Rank 0 has arrived at its rendezvous and waits there for rank 1.
    in_rendezvous = cluster.AwaitKey("job-abort", 1000, "gloo/arrived/0");
    fired_at = Clock::now();
    cluster.engine(0).Abort();
  });
  ReportPhaseRequest report;
  const auto t0 = Clock::now();
  absl::Status st = cluster.engine(0).RunPhase(cmd, &report);
  const auto done = Clock::now();
  aborter.join();
  EXPECT_TRUE(in_rendezvous) << "rank 0 never arrived at its rendezvous";
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_EQ(common::FailureKindOf(st), tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_LT(std::chrono::duration<double>(done - fired_at).count(), 1.0)
      << "SETUP returned " << std::chrono::duration<double>(done - t0).count() << " s after it started";
  EXPECT_EQ(cluster.engine(0).current_job(), "");

  // The engine is usable again: a full SETUP of both ranks and a step.
  cluster.SetupOk(spec);
  cluster.RunOk(tandem::v1::PHASE_SFT_STEP, 1);
}

TEST(SetupAbortTest, AbortBeforeASetupDoesNotAffectIt) {
  EngineCluster cluster(2, "job-abort-2");
  const JobSpec spec = ParseSpec(TinySftYaml(), {"cluster.workers=2"});
  cluster.engine(0).Abort();  // an abort_job for an earlier generation
  cluster.engine(1).Abort();
  cluster.SetupOk(spec);
  cluster.RunOk(tandem::v1::PHASE_SFT_STEP, 1);
}

}  // namespace
}  // namespace tandem::enginetest
