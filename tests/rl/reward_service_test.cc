// RewardClient against real in-process gRPC RewardService servers: correct,
// slow (timeout), failing, wrong count, non-finite, and unreachable.
#include "worker/rl/reward_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "tandem/v1/reward.grpc.pb.h"

namespace tandem::rl {
namespace {

using Clock = std::chrono::steady_clock;

enum class Mode { kCorrect, kSlow, kError, kWrongCount, kNan };

class TestRewardService final : public tandem::v1::RewardService::Service {
 public:
  explicit TestRewardService(Mode mode) : mode_(mode) {}
  grpc::Status Score(grpc::ServerContext* context, const tandem::v1::ScoreRequest* request,
                     tandem::v1::ScoreResponse* response) override {
    last_job_ = request->job_id();
    last_step_ = request->step();
    switch (mode_) {
      case Mode::kSlow: {
        // Answers after 5 s unless the client gives up first.
        const auto until = Clock::now() + std::chrono::seconds(5);
        while (Clock::now() < until && !context->IsCancelled()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
      }
      case Mode::kError:
        return grpc::Status(grpc::StatusCode::INTERNAL, "scorer crashed");
      default:
        break;
    }
    for (const auto& item : request->items()) {
      double r = item.completion() == item.reference() ? 1.0 : 0.0;
      r += 0.01 * item.completion_ids_size();
      response->add_rewards(mode_ == Mode::kNan ? NAN : r);
    }
    if (mode_ == Mode::kWrongCount) response->mutable_rewards()->RemoveLast();
    return grpc::Status::OK;
  }
  std::string last_job_;
  int64_t last_step_ = -1;

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
  ~Server() { Stop(); }
  void Stop() {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
      server_->Wait();
      server_.reset();
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  TestRewardService service_;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::vector<RewardRequestItem> Items() {
  return {{"1+1=", "2", "2", {5, 2}, {}, false}, {"2+2=", "5", "4", {8}, {}, false}, {"3+3=", "6", "6", {}, {}, false}};
}

std::unique_ptr<RewardClient> Client(const std::string& address, int timeout_ms = 2000) {
  auto c = RewardClient::Create({.address = address, .timeout_ms = timeout_ms, .job_id = "job-7"});
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(c).value();
}

TEST(RewardServiceTest, CorrectServer) {
  Server server(Mode::kCorrect);
  auto client = Client(server.address());
  auto items = Items();
  auto r = client->Score(items, 12);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_DOUBLE_EQ((*r)[0], 1.02);
  EXPECT_DOUBLE_EQ((*r)[1], 0.01);
  EXPECT_DOUBLE_EQ((*r)[2], 1.0);
  EXPECT_EQ(server.service_.last_job_, "job-7");
  EXPECT_EQ(server.service_.last_step_, 12);
  auto empty = client->Score({}, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(RewardServiceTest, SlowServerTimesOutClearly) {
  Server server(Mode::kSlow);
  auto client = Client(server.address(), 300);
  const auto start = Clock::now();
  auto r = client->Score(Items(), 1);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.status().message(), "reward service at " + server.address() + " did not answer within 300 ms");
  EXPECT_LT(secs, 2.0);
}

TEST(RewardServiceTest, ServerErrorIsPropagated) {
  Server server(Mode::kError);
  auto r = Client(server.address())->Score(Items(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("scorer crashed"), std::string::npos);
  EXPECT_NE(r.status().message().find(server.address()), std::string::npos);
}

TEST(RewardServiceTest, WrongCountAndNonFinite) {
  Server wrong(Mode::kWrongCount);
  auto r = Client(wrong.address())->Score(Items(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("returned 2 rewards for 3 items"), std::string::npos) << r.status();
  Server nan(Mode::kNan);
  r = Client(nan.address())->Score(Items(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("non-finite"), std::string::npos) << r.status();
}

TEST(RewardServiceTest, UnreachableFailsFast) {
  std::string address;
  {
    Server gone(Mode::kCorrect);
    address = gone.address();
  }  // port now closed
  const auto start = Clock::now();
  auto r = Client(address, 3000)->Score(Items(), 1);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("is unreachable"), std::string::npos);
  EXPECT_LT(secs, 3.5);
}

TEST(RewardServiceTest, OptionErrors) {
  EXPECT_FALSE(RewardClient::Create({.address = ""}).ok());
  EXPECT_FALSE(RewardClient::Create({.address = "x:1", .timeout_ms = 0}).ok());
  auto c = RewardClient::Create({.address = "x:1", .tls_ca_file = "/nonexistent/ca.pem"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("CA file"), std::string::npos);
}

}  // namespace
}  // namespace tandem::rl
