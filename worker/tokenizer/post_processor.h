// PostProcessor: what Encode adds around the ids of the text when
// add_special_tokens is set. Supported: TemplateProcessing (its "single"
// template; pair encoding is not offered), ByteLevel (adds nothing: it only
// moves offsets) and Sequence of those. tokenizer_config.json's
// add_bos_token / add_eos_token replace it with "[bos] $A [eos]", as
// transformers does. Immutable after loading; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"

namespace tandem::tokenizer {

class PostProcessor {
 public:
  // j may be null (adds nothing). known_id(id) says whether the tokenizer has
  // a token with this id.
  static absl::StatusOr<PostProcessor> FromJson(const Json& j, const std::string& path,
                                                const std::function<bool(int32_t)>& known_id);
  static PostProcessor BosEos(std::optional<int32_t> bos, std::optional<int32_t> eos);

  // Rewrites *ids (the text's ids) into the final sequence.
  void Apply(bool add_special_tokens, std::vector<int32_t>* ids) const;

 private:
  // One template: ids before the sequence, ids after it.
  struct Template {
    std::vector<int32_t> before, after;
  };
  static absl::Status Append(const Json& j, const std::string& path, const std::function<bool(int32_t)>& known_id,
                             std::vector<Template>* templates);

  std::vector<Template> templates_;
};

}  // namespace tandem::tokenizer
