// Typed reads of tokenizer.json fields whose errors name the JSON path
// ("pre_tokenizer.pretokenizers[0].behavior: expected a string, got a
// number"). Every component reads its object through these and lists the
// fields it knows, so a field it would ignore is refused instead.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

using Json = nlohmann::json;

// "a.b" / "a[3]".
// Most ids below a vocabulary's largest one that no token may use (bounds
// the id tables a small hostile file can make us allocate).
inline constexpr int64_t kMaxUnusedIds = 1 << 20;

// s in double quotes, for error messages.
std::string Quote(std::string_view s);

std::string JsonPath(const std::string& parent, std::string_view key);
std::string JsonPath(const std::string& parent, size_t index);

// "a string", "a number", "null", ...
std::string JsonTypeName(const Json& j);

absl::Status JsonTypeError(const std::string& path, std::string_view expected, const Json& got);

// j must be an object whose keys are all in `known`.
absl::Status CheckFields(const Json& j, const std::string& path, std::initializer_list<std::string_view> known);

// The member `key` of object j, or nullptr when absent.
const Json* FindField(const Json& j, std::string_view key);

// Absent: `fallback`. Present: must be a boolean.
absl::StatusOr<bool> ReadBool(const Json& j, const std::string& path, std::string_view key, bool fallback);
// Must be present and a string.
absl::StatusOr<std::string> ReadString(const Json& j, const std::string& path, std::string_view key);
// Absent or null: nullopt; otherwise must be a string.
absl::StatusOr<std::optional<std::string>> ReadOptionalString(const Json& j, const std::string& path,
                                                              std::string_view key);
// Absent: `fallback`. Present: an integer in [lo, hi].
absl::StatusOr<int64_t> ReadInt(const Json& j, const std::string& path, std::string_view key, int64_t fallback,
                                int64_t lo, int64_t hi);
// An integer value in [lo, hi] (j itself).
absl::StatusOr<int64_t> ReadIntValue(const Json& j, const std::string& path, int64_t lo, int64_t hi);

// A string that holds exactly one Unicode character.
absl::StatusOr<std::string> ReadChar(const Json& j, const std::string& path, std::string_view key,
                                     std::string_view fallback);

// The required "type" field of a component.
absl::StatusOr<std::string> ReadType(const Json& j, const std::string& path);

// `<path>.type "<type>" is not supported (supported: <list>)`.
absl::Status UnsupportedType(const std::string& path, const std::string& type, std::string_view supported);

// Prefixes a status message with context ("tokenizer.json: ").
absl::Status Annotate(const absl::Status& s, std::string_view prefix);

}  // namespace tandem::tokenizer
