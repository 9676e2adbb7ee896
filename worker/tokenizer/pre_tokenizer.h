// PreTokenizer: the tokenizer.json "pre_tokenizer", which cuts normalized
// text into the words the model encodes one by one. Supported: Split
// (String or Regex pattern; behaviors Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
// (add_prefix_space, use_regex with the GPT-2 pattern), Metaspace
// (replacement, prepend_scheme always/first/never, split) and Sequence of
// those. Anything else is refused when loading. Immutable after loading;
// thread-safe (per-call state lives in a Scratch).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/pattern.h"

namespace tandem::tokenizer {

class PreTokenizer {
 public:
  // j may be null: the whole text is one word.
  static absl::StatusOr<PreTokenizer> FromJson(const Json& j, const std::string& path);

  // Buffers for one call of Run (reused across calls by the same thread).
  struct Scratch {
    std::vector<std::vector<Segment>> segments;
    std::vector<std::string> prefixed;
    std::vector<std::string> mapped;
  };

  // Calls emit(word) for each word of `text`, in order. `at_start`: text
  // starts at offset 0 of the input (Metaspace's prepend_scheme "first").
  void Run(std::string_view text, bool at_start, Scratch* scratch,
           absl::FunctionRef<void(std::string_view)> emit) const;

  bool empty() const { return stages_.empty(); }

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Stage {
    Kind kind;
    std::shared_ptr<const Pattern> pattern = nullptr;  // Split; ByteLevel with use_regex
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement = "";   // Metaspace
    Prepend prepend = Prepend::kAlways;
    bool split = true;
  };

  static absl::Status Append(const Json& j, const std::string& path, std::vector<Stage>* stages);
  void RunStage(size_t i, std::string_view piece, bool at_start, Scratch* scratch,
                absl::FunctionRef<void(std::string_view)> emit) const;
  // Applies behavior (and invert) to segs in place: what is left are the
  // pieces to keep.
  static void ApplyBehavior(Behavior behavior, bool invert, std::vector<Segment>* segs);

  std::vector<Stage> stages_;
};

}  // namespace tandem::tokenizer
