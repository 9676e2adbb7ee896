#include "worker/model/strict_json.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::model {

namespace {

template <typename json>
absl::StatusOr<json> ParseStrict(std::string_view text, absl::string_view what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::vector<bool> is_object;              // per open container
  std::string error;
  auto callback = [&](int depth, typename json::parse_event_t event, json& parsed) {
    if (!error.empty()) return false;
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) {
          error = absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels");
          return false;
        }
        is_object.push_back(event == json::parse_event_t::object_start);
        if (is_object.back()) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!is_object.empty()) {
          if (is_object.back()) keys.pop_back();
          is_object.pop_back();
        }
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.template get<std::string>()).second) {
          error = absl::StrCat("key '", parsed.template get<std::string>(), "' appears twice in one object");
          return false;
        }
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", error));
  if (j.is_discarded()) {
    // Parse again with exceptions for nlohmann's message (line and column).
    try {
      const json again = json::parse(text.begin(), text.end());
      (void)again;
    } catch (const typename json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
  }
  return j;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseStrictJson(std::string_view text, absl::string_view what) {
  return ParseStrict<nlohmann::json>(text, what);
}

absl::StatusOr<nlohmann::ordered_json> ParseStrictOrderedJson(std::string_view text, absl::string_view what) {
  return ParseStrict<nlohmann::ordered_json>(text, what);
}

}  // namespace tandem::model
