// Normalizer: the tokenizer.json "normalizer", applied to each stretch of
// text between added tokens before pre-tokenization. Supported: NFC, NFD,
// NFKC, NFKD (ICU), Prepend, Replace and Sequence of those; anything else is
// refused when loading. Immutable after loading; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/pattern.h"

namespace tandem::tokenizer {

class Normalizer {
 public:
  // j may be null (no normalization).
  static absl::StatusOr<Normalizer> FromJson(const Json& j, const std::string& path);

  bool empty() const { return steps_.empty(); }

  // Returns the normalized text: `text` itself when nothing changes it,
  // otherwise a view of *buffer.
  std::string_view Normalize(std::string_view text, std::string* buffer) const;

 private:
  enum class Kind { kUnicode, kPrepend, kReplace };
  struct Step {
    Kind kind;
    const void* unicode_form = nullptr;  // icu::Normalizer2 (owned by ICU)
    std::string text = "";               // Prepend: the prefix; Replace: the content
    std::shared_ptr<const Pattern> pattern = nullptr;
  };
  static absl::Status Append(const Json& j, const std::string& path, std::vector<Step>* steps);

  std::vector<Step> steps_;
};

}  // namespace tandem::tokenizer
