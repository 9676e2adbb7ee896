#include "worker/tokenizer/pattern.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::tokenizer {

absl::StatusOr<Pattern> Pattern::FromJson(const Json& j, const std::string& path) {
  if (!j.is_object() || j.size() != 1 || (!j.contains("String") && !j.contains("Regex"))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected {\"String\": ...} or {\"Regex\": ...}"));
  }
  Pattern p;
  if (j.contains("String")) {
    ASSIGN_OR_RETURN(p.source_, ReadString(j, path, "String"));
    return p;
  }
  ASSIGN_OR_RETURN(p.source_, ReadString(j, path, "Regex"));
  auto re = Regex::Compile(p.source_);
  if (!re.ok()) return Annotate(re.status(), absl::StrCat(JsonPath(path, "Regex"), ": "));
  p.regex_ = std::move(*re);
  return p;
}

absl::StatusOr<Pattern> Pattern::Literal(std::string_view text) {
  Pattern p;
  p.source_ = std::string(text);
  return p;
}

absl::StatusOr<Pattern> Pattern::FromRegex(std::string_view regex) {
  Pattern p;
  p.source_ = std::string(regex);
  ASSIGN_OR_RETURN(Regex re, Regex::Compile(regex));
  p.regex_ = std::move(re);
  return p;
}

template <typename F>
void Pattern::ForEachMatch(std::string_view text, F&& on_match) const {
  if (text.empty()) return;
  if (regex_) {
    regex_->FindAll(text, on_match);
    return;
  }
  if (source_.empty()) return;  // an empty literal matches nothing
  size_t pos = 0;
  while ((pos = text.find(source_, pos)) != std::string_view::npos) {
    on_match(pos, pos + source_.size());
    pos += source_.size();
  }
}

void Pattern::FindMatches(std::string_view text, std::vector<Segment>* out) const {
  out->clear();
  size_t prev = 0;
  ForEachMatch(text, [&](size_t start, size_t end) {
    if (prev != start) out->push_back({prev, start, false});
    out->push_back({start, end, true});
    prev = end;
  });
  if (prev != text.size()) out->push_back({prev, text.size(), false});
}

void Pattern::ReplaceAll(std::string_view text, std::string_view content, std::string* out) const {
  size_t prev = 0;
  ForEachMatch(text, [&](size_t start, size_t end) {
    out->append(text.substr(prev, start - prev));
    out->append(content);
    prev = end;
  });
  out->append(text.substr(prev));
}

}  // namespace tandem::tokenizer
