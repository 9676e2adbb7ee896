// Decoder: the tokenizer.json "decoder", turning token strings back into
// text. Supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace
// and Sequence of those, each as Hugging Face tokenizers does it (a
// ByteFallback run of bytes that is not valid UTF-8 gives one U+FFFD per
// byte; ByteLevel repairs invalid UTF-8 with one U+FFFD per maximal invalid
// subsequence). Without a decoder the tokens are joined with spaces.
// Immutable after loading; thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/pattern.h"

namespace tandem::tokenizer {

class Decoder {
 public:
  // j may be null (no decoder).
  static absl::StatusOr<Decoder> FromJson(const Json& j, const std::string& path);

  std::string Decode(std::vector<std::string> tokens) const;

  // Whether a trailing run of <0xNN> tokens can still change (ByteFallback).
  bool has_byte_fallback() const { return has_byte_fallback_; }

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  struct Step {
    Kind kind;
    std::shared_ptr<const Pattern> pattern = nullptr;  // Replace
    std::string text = "";                             // Replace: content; Strip: the character; Metaspace: replacement
    size_t start = 0, stop = 0;                        // Strip
    bool strip_first = true;                           // Metaspace: prepend_scheme is not "never"
  };
  static absl::Status Append(const Json& j, const std::string& path, std::vector<Step>* steps);
  static void Apply(const Step& step, std::vector<std::string>* tokens);

  std::vector<Step> steps_;
  bool present_ = false;
  bool has_byte_fallback_ = false;
};

}  // namespace tandem::tokenizer
