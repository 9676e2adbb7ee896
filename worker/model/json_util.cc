#include "worker/model/json_util.h"

#include "absl/strings/str_cat.h"

namespace tandem::model {

absl::StatusOr<nlohmann::json> ParseJsonLimited(std::string_view text) {
  using nlohmann::json;
  bool too_deep = false;
  // Called for every value with the number of containers around it; a value
  // refused here is not built (nor is anything inside it), and parsing goes
  // on to find the end of the document.
  auto limit = [&too_deep](int depth, json::parse_event_t event, json&) {
    if (depth >= kMaxJsonDepth &&
        (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)) {
      too_deep = true;
    }
    return !too_deep;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), limit);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  if (too_deep) return absl::InvalidArgumentError(absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
  return j;
}

}  // namespace tandem::model
