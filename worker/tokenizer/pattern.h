// Pattern: what Split pre-tokenizers and Replace normalizers/decoders match,
// {"String": "..."} (a literal) or {"Regex": "..."} (PCRE2 syntax, which
// covers what tokenizer.json files use: \p{L}, \p{N}, lookahead, (?i:...)).
// Immutable after construction; thread-safe.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/regex.h"

namespace tandem::tokenizer {

// A stretch of the input: a match of the pattern or the text between two.
struct Segment {
  size_t start;
  size_t end;
  bool is_match;
};

class Pattern {
 public:
  static absl::StatusOr<Pattern> FromJson(const Json& j, const std::string& path);
  static absl::StatusOr<Pattern> Literal(std::string_view text);
  static absl::StatusOr<Pattern> FromRegex(std::string_view regex);

  // Covers `text` with segments in order (Hugging Face's find_matches): each
  // match, and each non-empty stretch between matches. Empty text gives no
  // segments.
  void FindMatches(std::string_view text, std::vector<Segment>* out) const;

  // Appends text to *out with every match replaced by `content`.
  void ReplaceAll(std::string_view text, std::string_view content, std::string* out) const;

  bool is_regex() const { return regex_.has_value(); }
  const std::string& source() const { return source_; }

 private:
  template <typename F>
  void ForEachMatch(std::string_view text, F&& on_match) const;

  std::optional<Regex> regex_;  // empty: a literal
  std::string source_;          // the literal, or the regex source
};

}  // namespace tandem::tokenizer
