// Regex: a compiled PCRE2 pattern (UTF + UCP: \p{L}, \s and case folding are
// Unicode-aware), JIT-compiled when the library supports it. Compiled once,
// then immutable: safe to share between threads. Matching uses per-thread
// match data and JIT stack, so a hot loop allocates nothing.
//
// FindAll iterates matches the way Hugging Face tokenizers (Oniguruma's
// find_iter) does: leftmost, non-overlapping; an empty match at the end of
// the previous match is skipped by moving one character on. The subject must
// be valid UTF-8 (it is not checked again). A match that hits a PCRE2
// resource limit (a pathological pattern on a huge input) ends the iteration:
// the rest of the subject counts as unmatched.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

class Regex {
 public:
  // `literal`: pattern is a plain string to find, not a regular expression.
  // Errors name PCRE2's message and the offset in the pattern.
  static absl::StatusOr<Regex> Compile(std::string_view pattern, bool literal = false);

  // Calls on_match(start, end) (byte offsets into subject) for each match.
  template <typename F>
  void FindAll(std::string_view subject, F&& on_match) const {
    size_t pos = 0;
    bool have_last = false;
    size_t last_end = 0;
    while (pos <= subject.size()) {
      size_t start, end;
      if (!Find(subject, pos, &start, &end)) return;
      if (start == end && have_last && last_end == end) {
        if (pos >= subject.size()) return;
        pos += Utf8Advance(subject, pos);
        continue;
      }
      on_match(start, end);
      pos = end;
      last_end = end;
      have_last = true;
    }
  }

  // First match starting at or after byte `from`; false when there is none.
  bool Find(std::string_view subject, size_t from, size_t* start, size_t* end) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  struct Code;
  static size_t Utf8Advance(std::string_view s, size_t pos);

  std::shared_ptr<const Code> code_;
  std::string pattern_;
  bool jit_ = false;
};

}  // namespace tandem::tokenizer
