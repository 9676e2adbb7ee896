// Rollout bookkeeping for GRPO/PPO: trajectories, the packed training batch
// built from them for the UPDATE phase, mini-batch splits and the staleness
// filter of the disaggregated async mode.
//
// Layout of one trajectory in the packed batch: tokens = prompt_ids ++
// completion_ids (prompt_ids already start with bos; completion_ids end with
// eos when eos was sampled, and no eos is added). Position j predicts token
// j+1; loss_mask[j] = 1 exactly where that target is a completion token. The
// per-token vectors (advantages, logp_sampled) are aligned with targets:
// entry j belongs to target j+1, and is 0 where the mask is 0.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/tokenizer.h"
#include "worker/rl/sft_data.h"
#include "worker/text/text_tokenizer.h"

namespace tandem::rl {

struct Trajectory {
  std::vector<int32_t> prompt_ids;      // model input, starting with bos
  std::vector<int32_t> completion_ids;  // sampled tokens (incl. eos if sampled)
  std::vector<float> logp_sampled;      // per completion token, rollout policy
  double reward = 0;
  int64_t group = 0;           // global prompt index within the step
  int64_t policy_version = 0;  // weights version that generated it
};

struct RlBatch {
  PackedBatch packed;               // tokens/targets/positions/cu/loss_mask
  std::vector<float> advantages;    // per token, aligned with targets
  std::vector<float> logp_sampled;  // per token, aligned with targets
  int64_t num_loss_tokens = 0;      // sum of loss_mask
};

// Packs `trajectories` with one advantage per trajectory. Fails when sizes
// disagree, a prompt is empty, or logp_sampled is neither empty nor one per
// completion token.
// Ids from vocab_size on (a soft prompt's, model/soft_prompt.h, at the
// start of a prompt) are inputs only: their positions get target 0.
absl::StatusOr<RlBatch> BuildRlBatch(std::span<const Trajectory> trajectories, std::span<const double> advantages,
                                     int32_t vocab_size = INT32_MAX);

// Tokens with loss (completion tokens) over the trajectories: the global
// normaliser for token aggregation, computable on every rank.
int64_t CountCompletionTokens(std::span<const Trajectory> trajectories);

// Splits [0, n) into `parts` consecutive ranges differing by at most one in
// size (part k: [k*n/parts, (k+1)*n/parts)).
std::vector<IndexRange> SplitEven(int64_t n, int parts);

struct StalenessStats {
  int64_t kept = 0;
  int64_t dropped = 0;
  int64_t max_kept_staleness = 0;  // largest current - version kept
};

// Removes trajectories whose staleness (current_version - policy_version)
// exceeds max_staleness, keeping the order of the rest. A trajectory from a
// version newer than current_version is an error.
absl::StatusOr<StalenessStats> DropStale(std::vector<Trajectory>* trajectories, int64_t current_version,
                                         int64_t max_staleness);

// Completion text for reward functions: decodes ids before the first eos.
struct CompletionText {
  std::string text;
  bool terminated = false;  // an eos was sampled
};
CompletionText DecodeCompletion(std::span<const int32_t> completion_ids, const model::CharTokenizer& tok);
// Any tokenizer: the ids before the first of `stop_ids` (the tokenizer's eos
// when empty), special tokens skipped, and the text cut before the first
// occurrence of any of `stop_strings` (which also counts as terminated).
CompletionText DecodeCompletion(std::span<const int32_t> completion_ids, const text::Tokenizer& tok,
                                std::span<const int32_t> stop_ids, std::span<const std::string> stop_strings = {});
// Where the first of `stop_strings` starts in `text` (npos: none).
size_t FindStopString(std::string_view text, std::span<const std::string> stop_strings);

}  // namespace tandem::rl
