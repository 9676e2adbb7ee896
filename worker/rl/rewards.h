// Verifiable rewards for text tasks: a response (decoded text, special
// tokens skipped) is scored against the reference answer of its data row.
//
//   gsm8k  the reference's answer is what follows its last "####" (the whole
//          reference when it has none); the response's answer is the first
//          number after its last "####", else its last number. Numbers are
//          compared after dropping "$", thousands commas ("1,000") and
//          trailing zeros of a fraction ("42.0" = "42", "2.50" = "2.5").
//   math   the last \boxed{...} (balanced braces; \fbox too) of the response
//          against the reference's last \boxed{...} (the whole reference
//          when it has none), after NormalizeMathAnswer; two answers that
//          both read as numbers (decimals, \frac{a}{b}, a/b) are equal when
//          their values are.
//   exact  the trimmed response equals the trimmed reference.
//   regex  a PCRE2 pattern is searched in the response; its last match's
//          first capture group (the whole match when it has none), trimmed,
//          must equal the trimmed reference.
// reward = (correct ? 1 : 0) + (well_formed ? format_reward : 0). Well formed:
// format_pattern matches (when given), else gsm8k: a number follows "####";
// math: a \boxed{} is present; exact: the response is not blank; regex: the
// pattern matches.
// A VerifiableReward is immutable after Create and thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/rl/tasks.h"

namespace tandem::rl {

struct RewardOptions {
  std::string type;            // gsm8k | math | exact | regex
  std::string pattern;         // regex: PCRE2 pattern
  double format_reward = 0;    // >= 0
  std::string format_pattern;  // optional PCRE2 pattern for the format reward
};

class Pcre2Pattern;  // rewards.cc

class VerifiableReward {
 public:
  // Errors name the field (reward.type, reward.pattern, ...).
  static absl::StatusOr<std::unique_ptr<VerifiableReward>> Create(const RewardOptions& options);
  ~VerifiableReward();

  RewardResult Score(std::string_view response, std::string_view reference) const;
  // The answer the rule reads from a response (nullopt: none found).
  std::optional<std::string> ExtractAnswer(std::string_view response) const;
  const RewardOptions& options() const { return options_; }

 private:
  VerifiableReward() = default;
  RewardOptions options_;
  std::unique_ptr<Pcre2Pattern> pattern_, format_;
};

// Building blocks, exposed for tests.
// GSM8K: the number after the last "####" or the last number (normalised).
std::optional<std::string> Gsm8kResponseAnswer(std::string_view response);
std::string Gsm8kReferenceAnswer(std::string_view reference);
// "$1,000.50" -> "1000.5"; "42.0" -> "42"; "-3." -> "-3".
std::string NormalizeNumber(std::string_view number);
// Content of the last \boxed{...} / \fbox{...} (or "\boxed 5"), braces balanced.
std::optional<std::string> LastBoxed(std::string_view text);
// Canonical form of a MATH answer (spaces, \dfrac/\tfrac, \left/\right,
// ^\circ, \%, \$, \text{} units, thousands commas, trailing .0, a/b,
// "x = 5" -> "5").
std::string NormalizeMathAnswer(std::string_view answer);
bool MathAnswersEqual(std::string_view a, std::string_view b);

}  // namespace tandem::rl
