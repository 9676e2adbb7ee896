// Parsing JSON from files that may be damaged or crafted (config.json,
// safetensors headers, tokenizer.json, checkpoint manifests and shard
// headers). nlohmann parses without recursion, but dump(), comparison and
// copy recurse: a document nested a million levels deep (a few MB of
// brackets) would overflow the stack the first time it is printed in an
// error message or hashed. So nesting is limited at parse time.
// Pure functions; never throw.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::model {

// Deeper than any file Tandem reads (they nest 2-6 levels).
inline constexpr int kMaxJsonDepth = 64;

// The parsed document, or InvalidArgument with the parser's message (what
// and where) or "nested deeper than 64 levels"; callers prefix the file.
absl::StatusOr<nlohmann::json> ParseJsonLimited(std::string_view text);

}  // namespace tandem::model
