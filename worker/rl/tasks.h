// Built-in verifiable tasks for SFT and RL: arithmetic, sort, reverse, count.
//
// Contract:
// - Sample(seed, index) is a pure function of (seed, index): the same example
//   on every rank, for every world size, in every replay.
// - The instance space (all prompts a task can produce) is split once, by a
//   fixed hash of the prompt text that does not depend on the seed, into a
//   training part (7/8) and a held-out part (1/8). Sample() only returns
//   training instances and EvalExamples() only held-out ones, so no evaluation
//   prompt is ever trained on, whatever the seeds.
// - Reward() compares the completion text exactly with the answer: the caller
//   passes the decoded completion up to (not including) EOS and says whether
//   EOS was produced; nothing is stripped (no whitespace trimming, no case
//   folding). With partial_reward > 0 a well-formed wrong answer earns that
//   weight times the fraction of positions, aligned at the end (place value
//   for numbers), where it agrees with the answer, over the longer length.
//   See docs/rl.md for the format rule.
// Tasks are immutable after MakeTask and safe to use from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::rl {

struct Example {
  std::string prompt;  // e.g. "17+25="
  std::string answer;  // e.g. "42"
};

struct RewardResult {
  double reward = 0.0;       // (correct ? 1 : partial credit) + (well_formed ? format_reward : 0)
  bool correct = false;      // completion == answer, and EOS was produced
  bool well_formed = false;  // EOS produced, non-empty, only answer-alphabet
                             // characters, at most max_answer_chars()
};

// Options of a built-in task. Zero values mean "default" so that a proto3
// TaskSpec can be copied field by field.
struct TaskOptions {
  std::string name{};         // arithmetic | sort | reverse | count
  std::string op{};           // arithmetic: add | mul (default add)
  int digits = 0;             // arithmetic operand digits, 1..9 (default 2)
  int min_len = 0;            // sort/reverse/count string length (default 2)
  int max_len = 0;            // (default 6), at most 64
  double format_reward = 0;   // >= 0; added when the answer is well formed
  double partial_reward = 0;  // in [0, 1]: credit for a well-formed wrong answer
};

class Task {
 public:
  virtual ~Task() = default;

  // "arithmetic", "sort", "reverse" or "count".
  virtual std::string name() const = 0;
  // Longest prompt / answer this task can produce, in characters.
  virtual int max_prompt_chars() const = 0;
  virtual int max_answer_chars() const = 0;
  // Characters a well-formed answer may contain.
  virtual std::string_view answer_alphabet() const = 0;

  // Training example `index` for `seed` (never a held-out instance).
  Example Sample(uint64_t seed, uint64_t index) const;
  // n held-out examples, distinct while the held-out part is large enough
  // (tiny instance spaces repeat examples rather than fail).
  std::vector<Example> EvalExamples(uint64_t seed, int n) const;
  // True when `prompt` belongs to the held-out part of the instance space.
  static bool IsHeldOut(std::string_view prompt);

  // Scores `completion` (text before EOS) against example.answer.
  RewardResult Reward(const Example& example, std::string_view completion, bool terminated = true) const;

  double format_reward() const { return format_reward_; }
  double partial_reward() const { return partial_reward_; }

 protected:
  explicit Task(double format_reward) : format_reward_(format_reward) {}
  // Draws one instance from the whole instance space using `key`.
  virtual Example Generate(uint64_t key) const = 0;

 private:
  friend absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskOptions&);
  double format_reward_;
  double partial_reward_ = 0;  // set once by MakeTask
};

// Validates `options` (errors name the offending field, e.g. "task.digits")
// and builds the task.
absl::StatusOr<std::unique_ptr<Task>> MakeTask(const TaskOptions& options);

}  // namespace tandem::rl
