// Rollout bookkeeping: see rollout.h.
#include "worker/rl/rollout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::rl {

absl::StatusOr<RlBatch> BuildRlBatch(std::span<const Trajectory> trajectories, std::span<const double> advantages,
                                     int32_t vocab_size) {
  if (advantages.size() != trajectories.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(advantages.size(), " advantages for ", trajectories.size(), " trajectories"));
  }
  RlBatch b;
  PackedBatch& p = b.packed;
  size_t total = 0;
  for (const Trajectory& t : trajectories) {
    total += t.prompt_ids.size() + t.completion_ids.size();
  }
  p.tokens.reserve(total);
  p.targets.reserve(total);
  p.positions.reserve(total);
  p.loss_mask.reserve(total);
  b.advantages.reserve(total);
  b.logp_sampled.reserve(total);
  p.cu_seqlens.push_back(0);
  for (size_t k = 0; k < trajectories.size(); ++k) {
    const Trajectory& t = trajectories[k];
    if (t.prompt_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("trajectory ", k, " has an empty prompt (needs bos)"));
    }
    const bool have_logp = !t.logp_sampled.empty();
    if (have_logp && t.logp_sampled.size() != t.completion_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("trajectory ", k, " has ", t.logp_sampled.size(),
                                                     " sampled log-probs for ", t.completion_ids.size(), " tokens"));
    }
    const size_t start = p.tokens.size();
    const int64_t prompt_len = static_cast<int64_t>(t.prompt_ids.size());
    p.tokens.insert(p.tokens.end(), t.prompt_ids.begin(), t.prompt_ids.end());
    p.tokens.insert(p.tokens.end(), t.completion_ids.begin(), t.completion_ids.end());
    const int64_t len = static_cast<int64_t>(p.tokens.size() - start);
    const float adv = static_cast<float>(advantages[k]);
    for (int64_t j = 0; j < len; ++j) {
      p.positions.push_back(static_cast<int32_t>(j));
      // Target j+1 is completion token (j + 1 - prompt_len).
      const bool on = j + 1 < len && j + 1 >= prompt_len;
      const int32_t next = j + 1 < len ? p.tokens[start + j + 1] : 0;
      p.targets.push_back(next < vocab_size ? next : 0);
      p.loss_mask.push_back(on ? 1.0f : 0.0f);
      b.advantages.push_back(on ? adv : 0.0f);
      b.logp_sampled.push_back(on && have_logp ? t.logp_sampled[j + 1 - prompt_len] : 0.0f);
      b.num_loss_tokens += on ? 1 : 0;
    }
    p.cu_seqlens.push_back(static_cast<int32_t>(p.tokens.size()));
    ++p.num_sequences;
  }
  return b;
}

int64_t CountCompletionTokens(std::span<const Trajectory> trajectories) {
  int64_t n = 0;
  for (const Trajectory& t : trajectories) {
    n += static_cast<int64_t>(t.completion_ids.size());
  }
  return n;
}

std::vector<IndexRange> SplitEven(int64_t n, int parts) {
  std::vector<IndexRange> out;
  if (parts < 1) parts = 1;
  out.reserve(parts);
  for (int k = 0; k < parts; ++k) out.push_back(RankSlice(n, k, parts));
  return out;
}

absl::StatusOr<StalenessStats> DropStale(std::vector<Trajectory>* trajectories, int64_t current_version,
                                         int64_t max_staleness) {
  if (max_staleness < 0) {
    return absl::InvalidArgumentError(absl::StrCat("placement.max_staleness must be >= 0, got ", max_staleness));
  }
  StalenessStats stats;
  for (const Trajectory& t : *trajectories) {
    if (t.policy_version > current_version) {
      return absl::InternalError(absl::StrCat("trajectory of policy version ", t.policy_version,
                                              " is newer than the trainer's version ", current_version));
    }
  }
  auto keep_end = std::stable_partition(trajectories->begin(), trajectories->end(), [&](const Trajectory& t) {
    return current_version - t.policy_version <= max_staleness;
  });
  stats.dropped = trajectories->end() - keep_end;
  trajectories->erase(keep_end, trajectories->end());
  stats.kept = static_cast<int64_t>(trajectories->size());
  for (const Trajectory& t : *trajectories) {
    stats.max_kept_staleness = std::max(stats.max_kept_staleness, current_version - t.policy_version);
  }
  return stats;
}

CompletionText DecodeCompletion(std::span<const int32_t> completion_ids, const model::CharTokenizer& tok) {
  CompletionText out;
  auto it = std::find(completion_ids.begin(), completion_ids.end(), tok.eos());
  out.terminated = it != completion_ids.end();
  out.text = tok.Decode(completion_ids.subspan(0, static_cast<size_t>(it - completion_ids.begin())));
  return out;
}

size_t FindStopString(std::string_view text, std::span<const std::string> stop_strings) {
  size_t best = std::string_view::npos;
  for (const std::string& s : stop_strings) {
    if (s.empty()) continue;
    const size_t p = text.find(s);
    if (p < best) best = p;
  }
  return best;
}

CompletionText DecodeCompletion(std::span<const int32_t> completion_ids, const text::Tokenizer& tok,
                                std::span<const int32_t> stop_ids, std::span<const std::string> stop_strings) {
  CompletionText out;
  auto is_stop = [&](int32_t id) {
    if (stop_ids.empty()) return tok.eos() && id == *tok.eos();
    return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  };
  auto it = std::find_if(completion_ids.begin(), completion_ids.end(), is_stop);
  out.terminated = it != completion_ids.end();
  out.text = tok.Decode(completion_ids.subspan(0, static_cast<size_t>(it - completion_ids.begin())),
                        /*skip_special_tokens=*/true);
  const size_t cut = FindStopString(out.text, stop_strings);
  if (cut != std::string::npos) {
    out.text.resize(cut);
    out.terminated = true;
  }
  return out;
}

}  // namespace tandem::rl
