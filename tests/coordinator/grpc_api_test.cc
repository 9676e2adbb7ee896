// In-process coordinator on 127.0.0.1 (ephemeral ports): every RPC with bad
// input or bad credentials, health after each; jobs driven end to end by
// fake workers against the Cluster service (tests/support/fake_worker.h).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/checkpoint_path.h"
#include "common/daemon_config.h"
#include "server/coordinator.h"
#include "server/jobs/job_manager.h"
#include "server/store/state_store.h"
#include "tandem/v1/cluster.grpc.pb.h"
#include "tandem/v1/control.grpc.pb.h"
#include "tests/support/coordinator_harness.h"
#include "tests/support/fake_worker.h"
#include "tests/support/http_client.h"

namespace tandem::server {
namespace {

using tandem::v1::Cluster;
using tandem::v1::Control;

constexpr char kAdmin[] = "admin-token-123";
constexpr char kJoin[] = "join-token-456";

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int ms = 5000) {
  return test_support::AuthContext(token, ms);
}

// A call with the token and a worker credential.
std::unique_ptr<grpc::ClientContext> WorkerCtx(const std::string& token, const std::string& credential, int ms = 5000) {
  auto ctx = test_support::AuthContext(token, ms);
  common::AddWorkerCredential(ctx.get(), credential);
  return ctx;
}

bool Healthy(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request;  // HealthCheckRequest{} encodes to nothing
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Slice> slices;
  if (!status.ok() || !response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes == std::string("\x08\x01", 2);  // status: SERVING
}

using test_support::FakeWorker;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::FreshTestDir("tandem_grpc");
    config_ = test_support::TestCoordinatorConfig(dir_, kAdmin, kJoin);
    config_.set_metrics_listen("127.0.0.1:0");
    config_.set_lease_ms(1500);
    config_.set_replacement_timeout_ms(1000);  // a lost worker with no spare fails the job quickly
    config_.set_heartbeat_ms(100);
    config_.set_phase_timeout_ms(10000);
    config_.set_max_message_bytes(1 << 20);
    config_.set_reattach_grace_ms(5000);
    StartCoordinator();
  }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartCoordinator() {
    coordinator_ = std::make_unique<Coordinator>(config_);
    absl::Status s = coordinator_->Start();
    ASSERT_TRUE(s.ok()) << s;
    {
      absl::MutexLock l(&address_mu_);
      address_ = coordinator_->grpc_address();
    }
    channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
    control_ = Control::NewStub(channel_);
    cluster_ = Cluster::NewStub(channel_);
  }
  std::string address() {
    absl::MutexLock l(&address_mu_);
    return address_;
  }
  FakeWorker* AddWorker(const std::string& name, decltype(FakeWorker::Options::fill) fill = nullptr) {
    workers_.push_back(std::make_unique<FakeWorker>(FakeWorker::Options{.name = name,
                                                                        .address = [this] { return address(); },
                                                                        .token = kJoin,
                                                                        .cache_reports = true,
                                                                        .fill = std::move(fill)}));
    return workers_.back().get();
  }
  tandem::v1::JobSpec SftSpec(int workers, int steps) {
    tandem::v1::JobSpec spec;
    spec.set_name("t");
    spec.set_kind(tandem::v1::JOB_KIND_SFT);
    spec.mutable_model()->set_from("/models/none");
    spec.mutable_cluster()->set_workers(workers);
    spec.mutable_train()->set_steps(steps);
    spec.mutable_train()->set_global_batch(4 * workers);
    spec.mutable_train()->set_micro_batch(4);
    return spec;
  }
  std::string Submit(const tandem::v1::JobSpec& spec) { return test_support::SubmitJob(control_.get(), kAdmin, spec); }
  tandem::v1::Job GetJob(const std::string& id) { return test_support::GetJob(control_.get(), kAdmin, id); }
  tandem::v1::Job WaitFor(const std::string& id, std::function<bool(const tandem::v1::Job&)> pred, int ms = 15000) {
    return test_support::WaitForJob(control_.get(), kAdmin, id, pred, ms, 50);
  }
  static bool Done(const tandem::v1::Job& j) { return IsTerminal(j.state()); }
  std::vector<tandem::v1::CheckpointRecord> Checkpoints(const std::string& id) {
    tandem::v1::ListCheckpointsRequest req;
    req.set_job_id(id);
    tandem::v1::ListCheckpointsResponse resp;
    grpc::Status st = control_->ListCheckpoints(Ctx(kAdmin).get(), req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return {resp.checkpoints().begin(), resp.checkpoints().end()};
  }

  std::string dir_;
  tandem::v1::CoordinatorConfig config_;
  std::unique_ptr<Coordinator> coordinator_;
  absl::Mutex address_mu_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Control::Stub> control_;
  std::unique_ptr<Cluster::Stub> cluster_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

#define EXPECT_CODE(call, code)                                                                  \
  do {                                                                                           \
    grpc::Status st_ = (call);                                                                   \
    EXPECT_EQ(st_.error_code(), grpc::StatusCode::code) << #call << ": " << st_.error_message(); \
    EXPECT_TRUE(Healthy(channel_)) << "unhealthy after " << #call;                               \
  } while (0)

TEST_F(CoordinatorTest, BadInputAndCredentialsGetClearErrors) {
  ASSERT_TRUE(Healthy(channel_));
  tandem::v1::ListJobsRequest list;
  tandem::v1::ListJobsResponse jobs;
  EXPECT_CODE(control_->ListJobs(Ctx("").get(), list, &jobs), UNAUTHENTICATED);
  EXPECT_CODE(control_->ListJobs(Ctx("wrong").get(), list, &jobs), UNAUTHENTICATED);
  EXPECT_CODE(control_->ListJobs(Ctx(kJoin).get(), list, &jobs), PERMISSION_DENIED);
  EXPECT_CODE(control_->ListJobs(Ctx(kAdmin).get(), list, &jobs), OK);
  list.set_limit(-1);
  EXPECT_CODE(control_->ListJobs(Ctx(kAdmin).get(), list, &jobs), INVALID_ARGUMENT);

  tandem::v1::SubmitJobRequest submit;
  tandem::v1::SubmitJobResponse submitted;
  EXPECT_CODE(control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted), INVALID_ARGUMENT);
  *submit.mutable_spec() = SftSpec(1, 3);
  submit.mutable_spec()->mutable_train()->set_steps(-4);
  grpc::Status st = control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "spec.train.steps: must be >= 1, got -4");
  submit.mutable_spec()->mutable_train()->set_steps(3);
  // Proto3 enums are open: undeclared numbers are refused, by name, and the
  // coordinator stays up (they used to reach the scheduler and crash it).
  submit.mutable_spec()->mutable_cluster()->set_device(static_cast<tandem::v1::DeviceKind>(99));
  st = control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message().rfind("spec.cluster.device: 99 is not allowed; allowed: ", 0), 0u) << st.error_message();
  EXPECT_TRUE(Healthy(channel_));
  submit.mutable_spec()->mutable_cluster()->set_device(tandem::v1::DEVICE_KIND_CPU);
  submit.mutable_spec()->set_kind(static_cast<tandem::v1::JobKind>(99));
  submit.mutable_spec()->set_name("");
  st = control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("kind"), std::string::npos) << st.error_message();
  EXPECT_TRUE(Healthy(channel_));
  submit.mutable_spec()->set_kind(tandem::v1::JOB_KIND_SFT);
  submit.mutable_spec()->set_name("t");
  submit.mutable_spec()->set_output_dir(std::string(5000, 'x'));
  EXPECT_CODE(control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted), INVALID_ARGUMENT);
  submit.mutable_spec()->set_output_dir(std::string(2 << 20, 'x'));  // over max message size
  EXPECT_CODE(control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted), RESOURCE_EXHAUSTED);

  tandem::v1::GetJobRequest get;
  tandem::v1::Job job;
  EXPECT_CODE(control_->GetJob(Ctx(kAdmin).get(), get, &job), INVALID_ARGUMENT);
  get.set_job_id("bad id!");
  EXPECT_CODE(control_->GetJob(Ctx(kAdmin).get(), get, &job), INVALID_ARGUMENT);
  get.set_job_id("j-999999");
  EXPECT_CODE(control_->GetJob(Ctx(kAdmin).get(), get, &job), NOT_FOUND);
  tandem::v1::CancelJobRequest cancel;
  tandem::v1::CancelJobResponse cancelled;
  cancel.set_job_id("j-999999");
  EXPECT_CODE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled), NOT_FOUND);
  cancel.set_reason("done\n2026-12-01T00:00:00 I coordinator] job j-1: job succeeded");  // a forged log line
  EXPECT_CODE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled), INVALID_ARGUMENT);
  cancel.clear_reason();
  tandem::v1::GetJobLogsRequest logs;
  tandem::v1::GetJobLogsResponse lines;
  logs.set_job_id("j-1");
  logs.set_limit(1000000);
  EXPECT_CODE(control_->GetJobLogs(Ctx(kAdmin).get(), logs, &lines), INVALID_ARGUMENT);
  tandem::v1::DrainWorkerRequest drain;
  tandem::v1::DrainWorkerResponse drained;
  EXPECT_CODE(control_->DrainWorker(Ctx(kAdmin).get(), drain, &drained), INVALID_ARGUMENT);
  drain.set_worker("nobody");
  EXPECT_CODE(control_->DrainWorker(Ctx(kAdmin).get(), drain, &drained), NOT_FOUND);
  tandem::v1::ListCheckpointsRequest ckpts;
  tandem::v1::ListCheckpointsResponse records;
  EXPECT_CODE(control_->ListCheckpoints(Ctx(kAdmin).get(), ckpts, &records), INVALID_ARGUMENT);
  {
    tandem::v1::WatchJobRequest watch;
    watch.set_job_id("j-999999");
    auto ctx = Ctx(kAdmin);
    auto reader = control_->WatchJob(ctx.get(), watch);
    tandem::v1::JobEvent e;
    while (reader->Read(&e)) {
    }
    EXPECT_CODE(reader->Finish(), NOT_FOUND);
  }

  tandem::v1::RegisterWorkerRequest reg;
  tandem::v1::RegisterWorkerResponse registered;
  reg.set_device(tandem::v1::DEVICE_KIND_CPU);
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), INVALID_ARGUMENT);  // no name
  reg.set_name("w");
  reg.set_device(tandem::v1::DEVICE_KIND_UNSPECIFIED);
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), INVALID_ARGUMENT);
  reg.set_device(tandem::v1::DEVICE_KIND_CPU);
  reg.set_host(std::string(300, 'h'));
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), INVALID_ARGUMENT);
  reg.set_host("node-1\r\nworker w-9 (admin) registered");
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), INVALID_ARGUMENT);
  reg.clear_host();
  EXPECT_CODE(cluster_->RegisterWorker(Ctx("").get(), reg, &registered), UNAUTHENTICATED);
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), OK);
  const std::string credential = registered.worker_credential();
  EXPECT_EQ(credential.size(), 64u);
  reg.set_worker_credential(credential);
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), OK);  // twice: same id
  EXPECT_EQ(registered.worker_id(), "w-1");
  EXPECT_EQ(registered.worker_credential(), credential);
  reg.set_worker_credential(std::string(5000, 'c'));
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), INVALID_ARGUMENT);
  reg.clear_worker_credential();

  tandem::v1::HeartbeatRequest hb;
  tandem::v1::HeartbeatResponse hb_resp;
  EXPECT_CODE(cluster_->Heartbeat(WorkerCtx(kJoin, credential).get(), hb, &hb_resp), INVALID_ARGUMENT);
  hb.set_worker_id("w-77");
  EXPECT_CODE(cluster_->Heartbeat(WorkerCtx(kJoin, credential).get(), hb, &hb_resp), OK);
  EXPECT_TRUE(hb_resp.reregister());
  {
    tandem::v1::AttachRequest attach;
    attach.set_worker_id("w-77");
    auto ctx = WorkerCtx(kJoin, credential);
    auto reader = cluster_->Attach(ctx.get(), attach);
    tandem::v1::WorkerCommand c;
    while (reader->Read(&c)) {
    }
    EXPECT_CODE(reader->Finish(), NOT_FOUND);
  }
  {
    // A client that goes away mid-stream: the server ends the stream.
    tandem::v1::AttachRequest attach;
    attach.set_worker_id("w-1");
    auto ctx = WorkerCtx(kJoin, credential);
    auto reader = cluster_->Attach(ctx.get(), attach);
    // Attach sends nothing until there is a command, so no event says the
    // stream is open: a moment open, then dropped, is the scenario.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ctx->TryCancel();
    tandem::v1::WorkerCommand c;
    while (reader->Read(&c)) {
    }
    EXPECT_CODE(reader->Finish(), CANCELLED);
  }
  tandem::v1::ReportPhaseRequest report;
  tandem::v1::ReportPhaseResponse reported;
  report.set_worker_id("w-1");
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.set_command_id("c");
  report.set_job_id("j-999999");
  for (int i = 0; i < 1001; ++i) report.add_log_lines("x");
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.clear_log_lines();
  // Published checkpoints: bounded in count, a path required and bounded,
  // a size that is not negative.
  for (int i = 0; i < 65; ++i) report.add_checkpoints()->set_path("/ckpt/step-1");
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.clear_checkpoints();
  report.add_checkpoints()->set_step(1);
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.mutable_checkpoints(0)->set_path(std::string(5000, 'p'));
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.mutable_checkpoints(0)->set_path("/ckpt/step-1");
  report.mutable_checkpoints(0)->set_bytes(-1);
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), INVALID_ARGUMENT);
  report.clear_checkpoints();
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, credential).get(), report, &reported), NOT_FOUND);

  tandem::v1::StoreSetRequest set;
  tandem::v1::StoreSetResponse set_resp;
  EXPECT_CODE(cluster_->StoreSet(WorkerCtx(kJoin, credential).get(), set, &set_resp), INVALID_ARGUMENT);
  set.mutable_scope()->set_job_id("j-000001");
  set.mutable_scope()->set_generation(1);
  set.set_key("k");
  EXPECT_CODE(cluster_->StoreSet(WorkerCtx(kJoin, credential).get(), set, &set_resp), FAILED_PRECONDITION);
  tandem::v1::StoreGetRequest sget;
  tandem::v1::StoreGetResponse sget_resp;
  sget.mutable_scope()->set_job_id("j-000001");
  EXPECT_CODE(cluster_->StoreGet(WorkerCtx(kJoin, credential).get(), sget, &sget_resp),
              INVALID_ARGUMENT);  // generation 0
  tandem::v1::StoreWaitRequest swait;
  tandem::v1::StoreWaitResponse swait_resp;
  EXPECT_CODE(cluster_->StoreWait(Ctx("").get(), swait, &swait_resp), UNAUTHENTICATED);
  tandem::v1::StoreAddRequest sadd;
  tandem::v1::StoreAddResponse sadd_resp;
  EXPECT_CODE(cluster_->StoreAdd(WorkerCtx(kJoin, credential).get(), sadd, &sadd_resp), INVALID_ARGUMENT);
  tandem::v1::StoreDeleteRequest sdel;
  tandem::v1::StoreDeleteResponse sdel_resp;
  EXPECT_CODE(cluster_->StoreDelete(WorkerCtx(kJoin, credential).get(), sdel, &sdel_resp), INVALID_ARGUMENT);
  tandem::v1::ListWorkersRequest lw;
  tandem::v1::ListWorkersResponse workers;
  EXPECT_CODE(control_->ListWorkers(Ctx(kAdmin).get(), lw, &workers), OK);
  EXPECT_EQ(workers.workers_size(), 1);
}

TEST_F(CoordinatorTest, SftJobRunsOnTwoWorkersWithEventsLogsAndStore) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  auto spec = SftSpec(2, 3);
  spec.mutable_train()->set_eval_every(2);
  std::string id = Submit(spec);
  tandem::v1::WatchJobRequest watch;
  watch.set_job_id(id);
  watch.set_from_start(true);
  auto ctx = Ctx(kAdmin, 20000);
  auto reader = control_->WatchJob(ctx.get(), watch);
  std::vector<tandem::v1::JobEvent> events;
  tandem::v1::JobEvent e;
  while (reader->Read(&e)) events.push_back(e);
  EXPECT_TRUE(reader->Finish().ok());
  auto job = GetJob(id);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.step(), 3);
  EXPECT_EQ(job.generation(), 1);
  const std::vector<std::string> expected = {"PHASE_SETUP(0)",  "PHASE_SFT_STEP(1)", "PHASE_SFT_STEP(2)",
                                             "PHASE_EVAL(2)",   "PHASE_SFT_STEP(3)", "PHASE_EVAL(3)",
                                             "PHASE_EXPORT(3)", "PHASE_TEARDOWN(3)"};
  EXPECT_EQ(a->phases(), expected);
  EXPECT_EQ(b->phases(), expected);
  int steps = 0;
  for (const auto& ev : events) {
    if (ev.kind() != "step") continue;
    ++steps;
    EXPECT_EQ(ev.metrics().step(), steps);
    EXPECT_NEAR(ev.metrics().loss(), 1.0 / steps, 1e-9);
    EXPECT_GT(ev.metrics().phase_seconds().at("sft_step"), 0);
    EXPECT_EQ(ev.metrics().peak_memory_bytes(), 1000 + steps);
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(events.back().state(), tandem::v1::JOB_STATE_SUCCEEDED);
  tandem::v1::GetJobLogsRequest logs;
  logs.set_job_id(id);
  tandem::v1::GetJobLogsResponse lines;
  ASSERT_TRUE(control_->GetJobLogs(Ctx(kAdmin).get(), logs, &lines).ok());
  EXPECT_GE(lines.lines_size(), 16);  // 8 phases x 2 ranks + coordinator lines
  // Workers are idle again and can take the next job.
  std::string second = Submit(SftSpec(1, 1));
  EXPECT_EQ(WaitFor(second, Done).state(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(Healthy(channel_));
}

TEST_F(CoordinatorTest, WarmStartThatReachesItsStopAccuracyEndsEarly) {
  // Both ranks report the probe verdict (it is allreduced); from the third
  // warm-start step on the model is held.
  auto fill = [](FakeWorker&, const tandem::v1::PhaseCommand& cmd, tandem::v1::ReportPhaseRequest* report) {
    if (cmd.phase() != tandem::v1::PHASE_SFT_STEP) return;
    auto& extra = *report->mutable_metrics()->mutable_extra();
    extra["warm_start_held"] = cmd.step() <= -3 ? 1 : 0;
    extra["teacher_forced_exact"] = cmd.step() <= -3 ? 0.375 : 0.125;
  };
  auto* a = AddWorker("alpha", fill);
  AddWorker("beta", fill);
  auto spec = SftSpec(2, 2);
  spec.set_kind(tandem::v1::JOB_KIND_GRPO);
  spec.mutable_init()->set_sft_steps(1000);
  spec.mutable_init()->set_sft_stop_accuracy(0.3);
  std::string id = Submit(spec);
  auto job = WaitFor(id, Done);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();
  const std::vector<std::string> expected = {
      "PHASE_SETUP(0)",  "PHASE_SFT_STEP(-1)", "PHASE_SFT_STEP(-2)", "PHASE_SFT_STEP(-3)",
      "PHASE_EVAL(0)",   "PHASE_ROLLOUT(1)",   "PHASE_SCORE(1)",     "PHASE_LOGPROBS(1)",
      "PHASE_UPDATE(1)", "PHASE_ROLLOUT(2)",   "PHASE_SCORE(2)",     "PHASE_LOGPROBS(2)",
      "PHASE_UPDATE(2)", "PHASE_EVAL(2)",      "PHASE_EXPORT(2)",    "PHASE_TEARDOWN(2)"};
  EXPECT_EQ(a->phases(), expected);
  tandem::v1::WatchJobRequest watch;
  watch.set_job_id(id);
  watch.set_from_start(true);
  auto ctx = Ctx(kAdmin, 5000);
  auto reader = control_->WatchJob(ctx.get(), watch);
  std::string said;
  tandem::v1::JobEvent e;
  while (reader->Read(&e)) {
    if (e.kind() == "warm_start") said = e.message();
  }
  EXPECT_EQ(said,
            "warm start reached init.sft.stop_accuracy 0.3 at step 3/1000 (teacher-forced exact 0.375); "
            "skipping the remaining 997");
}

TEST_F(CoordinatorTest, FailedPhaseFailsTheJobNamingStepPhaseWorkerRank) {
  AddWorker("alpha");
  auto* b = AddWorker("beta");
  b->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_FATAL);
    failure->set_message("boom");
    return c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 2;
  };
  std::string id = Submit(SftSpec(2, 4));
  auto job = WaitFor(id, Done);
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED);
  EXPECT_EQ(job.reason(), absl::StrCat("step 2 phase SFT_STEP failed on worker ", b->id(), " (rank 1): boom"));
}

TEST_F(CoordinatorTest, PendingReasonCancelAndLostWorker) {
  std::string big = Submit(SftSpec(4, 2));
  auto job = WaitFor(big, [](const auto& j) { return j.reason() == "needs 4 cpu workers, 0 idle"; });
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_PENDING);
  tandem::v1::CancelJobRequest cancel;
  cancel.set_job_id(big);
  tandem::v1::CancelJobResponse cancelled;
  ASSERT_TRUE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.job().state(), tandem::v1::JOB_STATE_CANCELLED);

  auto* a = AddWorker("alpha");
  a->stall = [](const tandem::v1::PhaseCommand& c) { return c.phase() == tandem::v1::PHASE_SFT_STEP; };
  std::string id = Submit(SftSpec(1, 2));
  WaitFor(id, [](const auto& j) { return j.state() == tandem::v1::JOB_STATE_RUNNING; });
  a->heartbeats_on = false;
  // A lost worker makes the job recover (generation bumped) instead
  // of failing; this worker keeps coming back and stalling, so cancel it.
  job = WaitFor(id, [](const auto& j) { return j.recovery().recoveries() >= 1 && j.generation() >= 2; });
  EXPECT_NE(job.recovery().reason().find("rank 0 lost: lease expired"), std::string::npos) << job.recovery().reason();
  tandem::v1::CancelJobRequest stop;
  stop.set_job_id(id);
  ASSERT_TRUE(control_->CancelJob(Ctx(kAdmin).get(), stop, &cancelled).ok());
  EXPECT_EQ(WaitFor(id, Done).state(), tandem::v1::JOB_STATE_CANCELLED);
  a->Stop();
}

// A job SubmitJob accepts is one every worker accepts: the worker's own
// model limits apply at the boundary.
TEST_F(CoordinatorTest, SubmitAppliesTheWorkersModelLimits) {
  auto inline_model = [this] {
    auto spec = SftSpec(1, 1);
    spec.mutable_model()->clear_from();
    auto* c = spec.mutable_model()->mutable_config();
    c->set_vocab_size(99);
    c->set_hidden_size(64);
    c->set_intermediate_size(128);
    c->set_num_hidden_layers(2);
    c->set_num_attention_heads(4);
    c->set_num_key_value_heads(2);
    c->set_max_position_embeddings(256);
    c->set_tokenizer("char");
    return spec;
  };
  struct Case {
    const char* what;
    std::function<void(tandem::v1::JobSpec*)> mutate;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"rope factor 2000",
       [](auto* s) {
         s->mutable_model()->mutable_config()->mutable_rope_scaling()->set_rope_type("linear");
         s->mutable_model()->mutable_config()->mutable_rope_scaling()->set_factor(2000);
       },
       "rope_scaling.factor"},
      {"char vocab 50", [](auto* s) { s->mutable_model()->mutable_config()->set_vocab_size(50); },
       "with the char tokenizer"},
      {"2^36 parameters",
       [](auto* s) {
         auto* c = s->mutable_model()->mutable_config();
         c->set_hidden_size(65536);
         c->set_intermediate_size(262144);
         c->set_num_hidden_layers(64);
         c->set_num_attention_heads(512);
         c->set_num_key_value_heads(512);
       },
       "2^36 parameters"},
      {"negative recovery", [](auto* s) { s->mutable_recovery()->set_max_recoveries(-3); }, "recovery.max_recoveries"},
      {"negative replacement timeout", [](auto* s) { s->mutable_recovery()->set_replacement_timeout_ms(-1); },
       "recovery.replacement_timeout_ms"},
  };
  tandem::v1::SubmitJobRequest req;
  tandem::v1::SubmitJobResponse resp;
  *req.mutable_spec() = inline_model();
  EXPECT_CODE(control_->SubmitJob(Ctx(kAdmin).get(), req, &resp), OK);

  // A job whose estimate per worker exceeds the largest worker's memory.
  tandem::v1::RegisterWorkerRequest reg;
  reg.set_name("small-1g");
  reg.set_device(tandem::v1::DEVICE_KIND_CPU);
  reg.set_memory_bytes(int64_t{1} << 30);
  tandem::v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered).ok());
  auto big = inline_model();
  big.mutable_model()->mutable_config()->set_hidden_size(1024);
  big.mutable_model()->mutable_config()->set_intermediate_size(4096);
  big.mutable_model()->mutable_config()->set_num_hidden_layers(8);
  big.mutable_cluster()->set_zero_stage(0);
  *req.mutable_spec() = big;
  grpc::Status st = control_->SubmitJob(Ctx(kAdmin).get(), req, &resp);
  EXPECT_CODE(st, FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("the job needs about"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("optimizer"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("the largest cpu worker has 1.0 GiB"), std::string::npos) << st.error_message();
  *req.mutable_spec() = inline_model();  // the small one still fits
  EXPECT_CODE(control_->SubmitJob(Ctx(kAdmin).get(), req, &resp), OK);
  for (const Case& c : cases) {
    *req.mutable_spec() = inline_model();
    c.mutate(req.mutable_spec());
    grpc::Status st = control_->SubmitJob(Ctx(kAdmin).get(), req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.error), std::string::npos) << c.what << ": " << st.error_message();
  }
  EXPECT_TRUE(Healthy(channel_));
}

// Stored jobs a coordinator cannot run (damaged, or written by another
// version: open enums, unknown states) fail at start with the reason; the
// coordinator serves, and does so again on the next start.
TEST_F(CoordinatorTest, StoredJobsItCannotRunAreQuarantinedAtStart) {
  coordinator_.reset();
  {
    auto store = StateStore::Open(config_.state_dir());
    ASSERT_TRUE(store.ok()) << store.status();
    auto put = [&](const std::string& id, tandem::v1::Job job) {
      job.set_id(id);
      ASSERT_TRUE((*store)->PutJob(job, PhaseCursor{0, 0}, std::stoi(id.substr(2))).ok());
    };
    tandem::v1::Job device;
    *device.mutable_spec() = SftSpec(1, 1);
    device.mutable_spec()->mutable_cluster()->set_device(static_cast<tandem::v1::DeviceKind>(99));
    device.set_state(tandem::v1::JOB_STATE_RUNNING);
    device.add_worker_ids("w-9");
    put("j-000050", device);
    tandem::v1::Job kind;
    *kind.mutable_spec() = SftSpec(1, 1);
    kind.mutable_spec()->set_kind(static_cast<tandem::v1::JobKind>(99));
    kind.mutable_spec()->clear_name();
    kind.set_state(tandem::v1::JOB_STATE_PENDING);
    put("j-000051", kind);
    tandem::v1::Job state;
    *state.mutable_spec() = SftSpec(1, 1);
    state.set_state(static_cast<tandem::v1::JobState>(42));
    put("j-000052", state);
  }
  for (int start = 0; start < 2; ++start) {
    StartCoordinator();
    for (const char* id : {"j-000050", "j-000051", "j-000052"}) {
      auto job = GetJob(id);
      EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED) << id;
      EXPECT_NE(job.reason().find("quarantined when the coordinator started"), std::string::npos)
          << id << ": " << job.reason();
    }
    EXPECT_TRUE(Healthy(channel_));
    coordinator_.reset();
  }
  StartCoordinator();
  AddWorker("alpha");
  EXPECT_EQ(WaitFor(Submit(SftSpec(1, 1)), Done).state(), tandem::v1::JOB_STATE_SUCCEEDED);
}

// Retention: finished jobs beyond max_finished_jobs are deleted with their
// events, logs and checkpoint records (here at the next start).
TEST_F(CoordinatorTest, FinishedJobsBeyondTheRetentionAreDeleted) {
  coordinator_.reset();
  config_.set_max_finished_jobs(2);
  StartCoordinator();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(Submit(SftSpec(3, 1)));  // no workers: pending, then cancelled
    tandem::v1::CancelJobRequest cancel;
    cancel.set_job_id(ids.back());
    tandem::v1::CancelJobResponse cancelled;
    ASSERT_TRUE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled).ok());
  }
  const std::string running = Submit(SftSpec(3, 1));  // not finished: kept
  coordinator_.reset();
  StartCoordinator();
  tandem::v1::GetJobRequest get;
  get.set_job_id(ids[0]);
  tandem::v1::Job job;
  EXPECT_CODE(control_->GetJob(Ctx(kAdmin).get(), get, &job), NOT_FOUND);
  tandem::v1::GetJobLogsRequest logs;
  logs.set_job_id(ids[0]);
  tandem::v1::GetJobLogsResponse lines;
  EXPECT_CODE(control_->GetJobLogs(Ctx(kAdmin).get(), logs, &lines), NOT_FOUND);
  for (const std::string& id : {ids[1], ids[2], running}) EXPECT_EQ(GetJob(id).id(), id);
}

// A state store that stops taking writes (full or failing disk): nothing is
// accepted that would be lost, the refusal says why, and /readyz reports
// not ready until writes succeed again.
TEST_F(CoordinatorTest, FailingStateStoreRefusesWritesAndIsNotReady) {
  auto ready = [&] { return test_support::HttpGet(coordinator_->metrics_port(), "/readyz", 5000).status; };
  EXPECT_EQ(ready(), 200);
  const std::string pending = Submit(SftSpec(3, 1));  // waits for workers
  coordinator_->store_for_test()->FailWritesForTest(true);
  tandem::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = SftSpec(1, 1);
  tandem::v1::SubmitJobResponse submitted;
  grpc::Status st = control_->SubmitJob(Ctx(kAdmin).get(), submit, &submitted);
  EXPECT_CODE(st, UNAVAILABLE);
  EXPECT_NE(st.error_message().find("the job was not accepted"), std::string::npos) << st.error_message();
  tandem::v1::CancelJobRequest cancel;
  cancel.set_job_id(pending);
  tandem::v1::CancelJobResponse cancelled;
  st = control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled);
  EXPECT_CODE(st, UNAVAILABLE);
  EXPECT_NE(st.error_message().find("cannot record the cancellation"), std::string::npos) << st.error_message();
  EXPECT_EQ(ready(), 503);
  EXPECT_EQ(GetJob(pending).state(), tandem::v1::JOB_STATE_PENDING);

  coordinator_->store_for_test()->FailWritesForTest(false);
  EXPECT_CODE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled), OK);
  EXPECT_EQ(cancelled.job().state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(ready(), 200);
  tandem::v1::ListJobsRequest list;
  tandem::v1::ListJobsResponse jobs;
  ASSERT_TRUE(control_->ListJobs(Ctx(kAdmin).get(), list, &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 1);  // the refused job is nowhere
  EXPECT_TRUE(Healthy(channel_));
}

// Identity: a worker's name, id, command stream, reports and its job's
// rendezvous store are bound to the credential it got at registration.
TEST_F(CoordinatorTest, WorkerIdentityIsBoundToItsCredential) {
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  a->stall = [](const tandem::v1::PhaseCommand& c) { return c.phase() == tandem::v1::PHASE_SFT_STEP; };
  b->stall = a->stall;
  std::string id = Submit(SftSpec(2, 2));
  auto job = WaitFor(id, [](const auto& j) { return j.state() == tandem::v1::JOB_STATE_RUNNING; });
  ASSERT_EQ(job.worker_ids_size(), 2);
  const std::string alpha = a->id();

  // A second worker started with a live worker's name, with or without its id.
  tandem::v1::RegisterWorkerRequest reg;
  reg.set_name("alpha");
  reg.set_device(tandem::v1::DEVICE_KIND_CPU);
  tandem::v1::RegisterWorkerResponse registered;
  grpc::Status st = cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered);
  EXPECT_CODE(st, ALREADY_EXISTS);
  EXPECT_NE(st.error_message().find("'alpha' is held by live worker " + alpha), std::string::npos)
      << st.error_message();
  EXPECT_NE(st.error_message().find("own --name"), std::string::npos) << st.error_message();
  reg.set_worker_id(alpha);
  reg.set_worker_credential("0123");
  EXPECT_CODE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered), ALREADY_EXISTS);

  // An outsider with the join token: its own identity works, nobody else's.
  reg.set_name("mallory");
  reg.clear_worker_id();
  reg.clear_worker_credential();
  ASSERT_TRUE(cluster_->RegisterWorker(Ctx(kJoin).get(), reg, &registered).ok());
  const std::string mallory = registered.worker_credential();
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id(alpha);
  tandem::v1::HeartbeatResponse hb_resp;
  EXPECT_CODE(cluster_->Heartbeat(Ctx(kJoin).get(), hb, &hb_resp), UNAUTHENTICATED);
  EXPECT_CODE(cluster_->Heartbeat(WorkerCtx(kJoin, mallory).get(), hb, &hb_resp), OK);
  EXPECT_TRUE(hb_resp.reregister());  // not renewed for alpha
  hb.set_preempting(true);            // nor preempting alpha
  EXPECT_CODE(cluster_->Heartbeat(WorkerCtx(kJoin, mallory).get(), hb, &hb_resp), OK);
  {
    tandem::v1::AttachRequest attach;
    attach.set_worker_id(alpha);
    auto ctx = WorkerCtx(kJoin, mallory);
    auto reader = cluster_->Attach(ctx.get(), attach);
    tandem::v1::WorkerCommand c;
    while (reader->Read(&c)) {
    }
    EXPECT_CODE(reader->Finish(), PERMISSION_DENIED);
  }
  tandem::v1::ReportPhaseRequest report;
  report.set_worker_id(alpha);
  report.set_command_id("c");
  report.set_job_id(id);
  report.set_generation(job.generation());
  auto* forged = report.add_checkpoints();
  forged->set_step(99999999);
  forged->set_path(common::CheckpointStepPath(job.spec().checkpoint().dir(), 99999999));
  tandem::v1::ReportPhaseResponse reported;
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, mallory).get(), report, &reported), PERMISSION_DENIED);
  // As itself, mallory is not a member: nothing of the report is used.
  report.set_worker_id(registered.worker_id());
  EXPECT_CODE(cluster_->ReportPhase(WorkerCtx(kJoin, mallory).get(), report, &reported), PERMISSION_DENIED);
  EXPECT_TRUE(Checkpoints(id).empty());
  // A member may only publish the job's own checkpoint directory of the step.
  report.set_worker_id(alpha);
  for (const std::string& path :
       std::vector<std::string>{"/evil/step-99999999", "/evil/../" + job.spec().checkpoint().dir() + "/step-00000001",
                                common::CheckpointStepPath(job.spec().checkpoint().dir(), 5)}) {
    forged->set_path(path);
    st = cluster_->ReportPhase(a->WorkerContext().get(), report, &reported);
    EXPECT_CODE(st, INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("is not the job's checkpoint directory"), std::string::npos) << path;
  }
  EXPECT_TRUE(Checkpoints(id).empty());

  // The rendezvous store of the job: its members only.
  tandem::v1::StoreSetRequest set;
  set.mutable_scope()->set_job_id(id);
  set.mutable_scope()->set_generation(job.generation());
  set.set_key("rank0_address");
  set.set_value("10.0.0.66:1");
  tandem::v1::StoreSetResponse set_resp;
  EXPECT_CODE(cluster_->StoreSet(Ctx(kJoin).get(), set, &set_resp), UNAUTHENTICATED);
  EXPECT_CODE(cluster_->StoreSet(WorkerCtx(kJoin, mallory).get(), set, &set_resp), PERMISSION_DENIED);
  EXPECT_CODE(cluster_->StoreSet(a->WorkerContext().get(), set, &set_resp), OK);
  tandem::v1::StoreAddRequest add;
  *add.mutable_scope() = set.scope();
  add.set_key("n");
  add.set_delta(INT64_MAX);
  tandem::v1::StoreAddResponse add_resp;
  EXPECT_CODE(cluster_->StoreAdd(WorkerCtx(kJoin, mallory).get(), add, &add_resp), PERMISSION_DENIED);
  EXPECT_CODE(cluster_->StoreAdd(b->WorkerContext().get(), add, &add_resp), OK);
  EXPECT_CODE(cluster_->StoreAdd(b->WorkerContext().get(), add, &add_resp), OUT_OF_RANGE);

  // Nothing of this reached the job.
  job = GetJob(id);
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.generation(), 1);
  tandem::v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  tandem::v1::CancelJobResponse cancelled;
  ASSERT_TRUE(control_->CancelJob(Ctx(kAdmin).get(), cancel, &cancelled).ok());
  EXPECT_EQ(WaitFor(id, Done).state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(Healthy(channel_));
}

// Rank 0's background checkpoint writes as the engine reports them: each
// one published after its CHECKPOINT phase comes with a later report of any
// phase, several with one report, everything left with EXPORT's, and with a
// failed phase's report too. The record must take the step and the size
// that were sent.
class BackgroundPublisher {
 public:
  static int64_t Bytes(int64_t step) { return (int64_t{5} << 30) * step + 17; }  // past 32 bits
  static std::string Path(const tandem::v1::JobSpec& spec, int64_t step) {
    return common::CheckpointStepPath(spec.checkpoint().dir(), step);
  }
  void Fill(FakeWorker& w, const tandem::v1::PhaseCommand& cmd, tandem::v1::ReportPhaseRequest* report) {
    if (w.last_assignment().rank() != 0) return;
    absl::MutexLock l(&mu_);
    if (cmd.phase() == tandem::v1::PHASE_CHECKPOINT) {
      written_.push_back(cmd.step());  // published later, in the background
      return;
    }
    if (report->ok() && cmd.phase() != tandem::v1::PHASE_EXPORT && written_.size() < 2) return;
    for (int64_t step : written_) {
      auto* c = report->add_checkpoints();
      c->set_step(step);
      c->set_path(Path(w.last_assignment().spec(), step));
      c->set_bytes(Bytes(step));
    }
    written_.clear();
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> written_ ABSL_GUARDED_BY(mu_);
};

TEST_F(CoordinatorTest, CheckpointRecordsKeepReportedStepAndSizeAcrossRestart) {
  BackgroundPublisher publisher;
  auto fill = [&publisher](FakeWorker& w, const tandem::v1::PhaseCommand& cmd, tandem::v1::ReportPhaseRequest* report) {
    publisher.Fill(w, cmd, report);
  };
  AddWorker("alpha", fill);
  AddWorker("beta", fill);
  auto spec = SftSpec(2, 4);
  spec.mutable_checkpoint()->set_every(1);
  spec.mutable_checkpoint()->set_keep(10);
  std::string id = Submit(spec);
  auto job = WaitFor(id, Done);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();
  // Steps 1 and 2 came with SFT_STEP(3)'s report, 3 and 4 with EXPORT's.
  auto records = Checkpoints(id);
  ASSERT_EQ(records.size(), 4u);
  for (int64_t step = 1; step <= 4; ++step) {
    const auto& r = records[step - 1];
    EXPECT_EQ(r.job_id(), id);
    EXPECT_EQ(r.step(), step);
    EXPECT_EQ(r.path(), BackgroundPublisher::Path(job.spec(), step));
    EXPECT_EQ(r.bytes(), BackgroundPublisher::Bytes(step));
    EXPECT_EQ(r.generation(), 1);
    EXPECT_EQ(r.world_size(), 2);
  }

  // The records are in the state store: a restarted coordinator lists the same.
  workers_.clear();
  coordinator_.reset();
  StartCoordinator();
  auto again = Checkpoints(id);
  ASSERT_EQ(again.size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(again[i].SerializeAsString(), records[i].SerializeAsString()) << again[i].DebugString();
  }
}

TEST_F(CoordinatorTest, CheckpointListFollowsTheWorkersRetention) {
  BackgroundPublisher publisher;
  AddWorker("alpha", [&publisher](FakeWorker& w, const tandem::v1::PhaseCommand& cmd,
                                  tandem::v1::ReportPhaseRequest* report) { publisher.Fill(w, cmd, report); });
  auto spec = SftSpec(1, 6);
  spec.mutable_checkpoint()->set_every(1);
  spec.mutable_checkpoint()->set_keep(2);
  std::string id = Submit(spec);
  auto job = WaitFor(id, Done);
  ASSERT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();
  auto records = Checkpoints(id);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step(), 5);
  EXPECT_EQ(records[1].step(), 6);
  EXPECT_EQ(records[1].bytes(), BackgroundPublisher::Bytes(6));
}

TEST_F(CoordinatorTest, CheckpointPublishedBeforeAFailedPhaseIsRecorded) {
  BackgroundPublisher publisher;
  auto* a =
      AddWorker("alpha", [&publisher](FakeWorker& w, const tandem::v1::PhaseCommand& cmd,
                                      tandem::v1::ReportPhaseRequest* report) { publisher.Fill(w, cmd, report); });
  a->fail = [](const tandem::v1::PhaseCommand& c, tandem::v1::PhaseFailure* failure) {
    failure->set_kind(tandem::v1::PHASE_FAILURE_KIND_FATAL);
    failure->set_message("boom");
    return c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 3;
  };
  auto spec = SftSpec(1, 4);
  spec.mutable_checkpoint()->set_every(2);
  std::string id = Submit(spec);
  auto job = WaitFor(id, Done);
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_FAILED);
  auto records = Checkpoints(id);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step(), 2);
  EXPECT_EQ(records[0].path(), BackgroundPublisher::Path(job.spec(), 2));
  EXPECT_EQ(records[0].bytes(), BackgroundPublisher::Bytes(2));
}

TEST_F(CoordinatorTest, RestartContinuesRunningJobFromCursor) {
  std::atomic<bool> hold{true};
  auto* a = AddWorker("alpha");
  auto* b = AddWorker("beta");
  auto stall = [&hold](const tandem::v1::PhaseCommand& c) {
    return hold.load() && c.phase() == tandem::v1::PHASE_SFT_STEP && c.step() == 2;
  };
  a->stall = stall;
  std::string id = Submit(SftSpec(2, 3));
  WaitFor(id, [](const auto& j) { return j.step() == 1; });
  // Step 2 is in flight: beta has run it, alpha holds it.
  auto ran_step2 = [b] {
    const auto p = b->phases();
    return std::find(p.begin(), p.end(), "PHASE_SFT_STEP(2)") != p.end();
  };
  for (int i = 0; i < 400 && !ran_step2(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_TRUE(ran_step2()) << "beta never ran step 2";
  // Restart on the same state dir and port while step 2 is in flight.
  std::string port = address().substr(address().rfind(':') + 1);
  coordinator_.reset();
  config_.set_listen("127.0.0.1:" + port);
  hold = false;
  StartCoordinator();
  auto job = WaitFor(id, Done, 20000);
  EXPECT_EQ(job.state(), tandem::v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.generation(), 1);
  // beta finished step 2 before the restart and answered the re-issued
  // command from its cache; alpha ran it once.
  EXPECT_GE(b->reports_replayed(), 1);
  std::vector<std::string> pa = a->phases();
  EXPECT_EQ(std::count(pa.begin(), pa.end(), "PHASE_SFT_STEP(2)"), 1);
  EXPECT_EQ(pa.back(), "PHASE_TEARDOWN(3)");
}

}  // namespace
}  // namespace tandem::server
