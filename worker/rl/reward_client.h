// RewardClient: calls an external tandem.v1.RewardService (proto/tandem/v1/
// reward.proto) to score a batch of completions.
//
// Every call has a deadline; failures come back as a Status naming the
// service address:
//   DEADLINE_EXCEEDED  "reward service at X did not answer within N ms"
//   UNAVAILABLE        "reward service at X is unreachable: ..."
//   INTERNAL           wrong number of rewards, or a non-finite reward
//   other codes        the service's own status, prefixed with the address
// Nothing blocks longer than the timeout. Thread-safe: Score may be called
// from several threads at once. gRPC types stay out of this header.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::rl {

struct RewardRequestItem {
  std::string prompt;
  std::string completion;
  std::string reference;  // expected answer when the task has one
  std::vector<int32_t> completion_ids;
  std::map<std::string, std::string> fields;  // the data row's other keys
  bool terminated = false;                    // the response ended (eos or a stop string)
};

struct RewardClientOptions {
  std::string address{};      // host:port (task.reward_service)
  int timeout_ms = 30000;     // per Score call (task.reward_timeout_ms)
  std::string tls_ca_file{};  // PEM roots; empty = plaintext channel
  std::string job_id{};       // sent in ScoreRequest.job_id
};

class RewardClient {
 public:
  // Validates options and creates the channel (does not connect yet).
  static absl::StatusOr<std::unique_ptr<RewardClient>> Create(const RewardClientOptions& options);
  ~RewardClient();
  RewardClient(const RewardClient&) = delete;
  RewardClient& operator=(const RewardClient&) = delete;

  // One reward per item, in order. An empty batch returns an empty vector
  // without calling the service.
  absl::StatusOr<std::vector<double>> Score(std::span<const RewardRequestItem> items, int64_t step) const;

  const RewardClientOptions& options() const { return options_; }

 private:
  struct Impl;
  RewardClient(RewardClientOptions options, std::unique_ptr<Impl> impl);
  RewardClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::rl
