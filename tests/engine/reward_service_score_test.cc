// An external reward service in GRPO SCORE: real in-process gRPC
// RewardService servers. A working one supplies the rewards; a slow one makes
// SCORE fail promptly with a clear timeout error (no hang); an erroring one
// makes SCORE fail naming the service.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>

#include "tandem/v1/reward.grpc.pb.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::enginetest {
namespace {

using Clock = std::chrono::steady_clock;
using tandem::v1::PHASE_ROLLOUT;
using tandem::v1::PHASE_SCORE;

enum class Mode { kConstant, kSlow, kError };

class TestRewardService final : public tandem::v1::RewardService::Service {
 public:
  explicit TestRewardService(Mode mode) : mode_(mode) {}
  grpc::Status Score(grpc::ServerContext* context, const tandem::v1::ScoreRequest* request,
                     tandem::v1::ScoreResponse* response) override {
    if (mode_ == Mode::kSlow) {
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (Clock::now() < until && !context->IsCancelled()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
    }
    if (mode_ == Mode::kError) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "scorer crashed");
    }
    for (int i = 0; i < request->items_size(); ++i) response->add_rewards(0.25);
    return grpc::Status::OK;
  }

 private:
  Mode mode_;
};

class Server {
 public:
  explicit Server(Mode mode) : service_(mode) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Server() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_->Wait();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  TestRewardService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

JobSpec Spec(const std::string& address) {
  return ParseSpec(R"(
name: reward-service
kind: grpo
seed: 3
model:
  config: )" + ::tandem::testing::TinyModelFlowMap() +
                       R"(
task: {name: arithmetic, op: add, digits: 1, eval_size: 8, reward_timeout_ms: 300}
train: {steps: 2, lr: 1.0e-3, global_batch: 8, micro_batch: 4, seq_len: 16}
rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 3}
cluster: {workers: 1, threads_per_worker: 1}
)",
                   {"task.reward_service=" + address});
}

TEST(RewardServiceScoreTest, ServiceSuppliesTheRewards) {
  Server server(Mode::kConstant);
  EngineCluster c(2);
  c.SetupOk(Spec(server.address()));
  c.RunOk(PHASE_ROLLOUT, 1);
  auto rep = c.RunOk(PHASE_SCORE, 1);
  EXPECT_DOUBLE_EQ(rep.metrics().reward_mean(), 0.25);
}

TEST(RewardServiceScoreTest, SlowServiceTimesOutClearly) {
  Server server(Mode::kSlow);
  EngineCluster c(1);
  c.SetupOk(Spec(server.address()));
  c.RunOk(PHASE_ROLLOUT, 1);
  const auto start = Clock::now();
  auto res = c.Run(PHASE_SCORE, 1);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_EQ(res[0].status.code(), absl::StatusCode::kDeadlineExceeded) << res[0].status;
  EXPECT_NE(res[0].status.message().find("reward service at " + server.address() + " did not answer within 300 ms"),
            std::string::npos)
      << res[0].status;
  // A reward service that does not answer is the cluster's failure.
  EXPECT_EQ(common::FailureKindOf(res[0].status), tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
  EXPECT_LT(secs, 3.0);
  std::printf("[reward-service] slow service: SCORE failed after %.2f s: %s\n", secs,
              std::string(res[0].status.message()).c_str());
}

TEST(RewardServiceScoreTest, ErroringServiceIsNamed) {
  Server server(Mode::kError);
  EngineCluster c(1);
  c.SetupOk(Spec(server.address()));
  c.RunOk(PHASE_ROLLOUT, 1);
  auto res = c.Run(PHASE_SCORE, 1);
  ASSERT_FALSE(res[0].status.ok());
  EXPECT_NE(res[0].status.message().find(server.address()), std::string::npos) << res[0].status;
  EXPECT_NE(res[0].status.message().find("scorer crashed"), std::string::npos) << res[0].status;
}

}  // namespace
}  // namespace tandem::enginetest
