// JSON from files that may be damaged or hostile (safetensors headers,
// config.json, checkpoint manifests, JSONL data rows): nlohmann::json keeps
// the last of duplicate keys silently, so two different readers could see
// two different files. ParseStrictJson refuses duplicate keys (naming the
// key and where it is) and nesting deeper than kMaxJsonDepth.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

inline constexpr int kMaxJsonDepth = 64;

// InvalidArgument naming `what` (e.g. "config.json") on any error.
absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, absl::string_view what);
// The same, keeping the order of object keys (chat messages, data rows).
absl::StatusOr<nlohmann::ordered_json> ParseStrictOrderedJson(std::string_view text, absl::string_view what);

}  // namespace tandem::model
