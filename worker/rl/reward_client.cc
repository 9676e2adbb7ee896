// RewardClient: see reward_client.h.
#include "worker/rl/reward_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tandem/v1/reward.grpc.pb.h"

namespace tandem::rl {

struct RewardClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<tandem::v1::RewardService::Stub> stub;
};

RewardClient::RewardClient(RewardClientOptions options, std::unique_ptr<Impl> impl)
    : options_(std::move(options)), impl_(std::move(impl)) {}

RewardClient::~RewardClient() = default;

absl::StatusOr<std::unique_ptr<RewardClient>> RewardClient::Create(const RewardClientOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("task.reward_service is empty: give the host:port of a RewardService");
  }
  if (options.timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("task.reward_timeout_ms must be > 0, got ", options.timeout_ms));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.tls_ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    std::ifstream in(options.tls_ca_file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read the reward service CA file ", options.tls_ca_file));
    }
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    creds = grpc::SslCredentials(ssl);
  }
  auto impl = std::make_unique<Impl>();
  impl->channel = grpc::CreateChannel(options.address, creds);
  impl->stub = tandem::v1::RewardService::NewStub(impl->channel);
  return std::unique_ptr<RewardClient>(new RewardClient(options, std::move(impl)));
}

absl::StatusOr<std::vector<double>> RewardClient::Score(std::span<const RewardRequestItem> items, int64_t step) const {
  if (items.empty()) return std::vector<double>{};
  tandem::v1::ScoreRequest request;
  request.set_job_id(options_.job_id);
  request.set_step(step);
  for (const RewardRequestItem& item : items) {
    tandem::v1::RewardItem* out = request.add_items();
    out->set_prompt(item.prompt);
    out->set_completion(item.completion);
    out->set_reference(item.reference);
    out->mutable_completion_ids()->Add(item.completion_ids.begin(), item.completion_ids.end());
    for (const auto& [k, v] : item.fields) (*out->mutable_fields())[k] = v;
    out->set_terminated(item.terminated);
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(options_.timeout_ms));
  tandem::v1::ScoreResponse response;
  const grpc::Status status = impl_->stub->Score(&context, request, &response);
  const std::string& addr = options_.address;
  if (!status.ok()) {
    switch (status.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return absl::DeadlineExceededError(
            absl::StrCat("reward service at ", addr, " did not answer within ", options_.timeout_ms, " ms"));
      case grpc::StatusCode::UNAVAILABLE:
        return absl::UnavailableError(
            absl::StrCat("reward service at ", addr, " is unreachable: ", status.error_message()));
      default:
        return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            absl::StrCat("reward service at ", addr, " failed: ", status.error_message()));
    }
  }
  if (response.rewards_size() != static_cast<int>(items.size())) {
    return absl::InternalError(absl::StrCat("reward service at ", addr, " returned ", response.rewards_size(),
                                            " rewards for ", items.size(), " items (expected one per item)"));
  }
  std::vector<double> rewards(response.rewards().begin(), response.rewards().end());
  for (size_t i = 0; i < rewards.size(); ++i) {
    if (!std::isfinite(rewards[i])) {
      return absl::InternalError(absl::StrCat("reward service at ", addr,
                                              " returned a non-finite "
                                              "reward (",
                                              rewards[i], ") for item ", i));
    }
  }
  return rewards;
}

}  // namespace tandem::rl
