// In-process coordinator test helpers (see coordinator_harness.h).
#include "tests/support/coordinator_harness.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/daemon_config.h"
#include "tests/support/fake_worker.h"

namespace tandem::test_support {

std::string FreshTestDir(const std::string& prefix) {
  std::string dir = ::testing::TempDir() + "/" + prefix + "_" + std::to_string(getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

tandem::v1::CoordinatorConfig TestCoordinatorConfig(const std::string& dir, const std::string& admin_token,
                                                    const std::string& join_token) {
  std::ofstream(dir + "/admin.tok") << admin_token << "\n";
  std::ofstream(dir + "/join.tok") << join_token << "\n";
  tandem::v1::CoordinatorConfig config = common::DefaultCoordinatorConfig();
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_state_dir(dir + "/state");
  config.set_runs_dir(dir + "/runs");
  config.mutable_auth()->set_admin_token_file(dir + "/admin.tok");
  config.mutable_auth()->set_join_token_file(dir + "/join.tok");
  return config;
}

std::string SubmitJob(tandem::v1::Control::Stub* control, const std::string& token, const tandem::v1::JobSpec& spec) {
  tandem::v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  tandem::v1::SubmitJobResponse resp;
  auto st = control->SubmitJob(AuthContext(token).get(), req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp.job_id();
}

tandem::v1::Job GetJob(tandem::v1::Control::Stub* control, const std::string& token, const std::string& id) {
  tandem::v1::GetJobRequest req;
  req.set_job_id(id);
  tandem::v1::Job job;
  control->GetJob(AuthContext(token).get(), req, &job).ok();
  return job;
}

tandem::v1::Job WaitForJob(tandem::v1::Control::Stub* control, const std::string& token, const std::string& id,
                           const std::function<bool(const tandem::v1::Job&)>& pred, int ms, int poll_ms) {
  tandem::v1::Job job;
  for (int waited = 0; waited < ms; waited += poll_ms) {
    job = GetJob(control, token, id);
    if (pred(job)) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  ADD_FAILURE() << "timed out; job: " << job.ShortDebugString();
  return job;
}

bool WaitForWorker(tandem::v1::Control::Stub* control, const std::string& token, const std::string& name,
                   tandem::v1::WorkerState state, int ms, int poll_ms) {
  std::string seen = "not listed";
  for (int waited = 0; waited <= ms; waited += poll_ms) {
    tandem::v1::ListWorkersResponse resp;
    if (control->ListWorkers(AuthContext(token).get(), tandem::v1::ListWorkersRequest(), &resp).ok()) {
      for (const auto& w : resp.workers()) {
        if (w.name() != name) continue;
        if (w.state() == state) return true;
        seen = tandem::v1::WorkerState_Name(w.state());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  ADD_FAILURE() << "worker " << name << " not " << tandem::v1::WorkerState_Name(state) << " within " << ms
                << " ms: " << seen;
  return false;
}

}  // namespace tandem::test_support
