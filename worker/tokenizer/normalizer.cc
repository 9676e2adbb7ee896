#include "worker/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "common/base/status_macros.h"

namespace tandem::tokenizer {

namespace {

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::FromJson(const Json& j, const std::string& path) {
  Normalizer n;
  if (j.is_null()) return n;
  RETURN_IF_ERROR(Append(j, path, &n.steps_));
  return n;
}

absl::Status Normalizer::Append(const Json& j, const std::string& path, std::vector<Step>* steps) {
  ASSIGN_OR_RETURN(const std::string type, ReadType(j, path));
  if (type == "Sequence") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "normalizers"}));
    const Json* list = FindField(j, "normalizers");
    const std::string list_path = JsonPath(path, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return JsonTypeError(list_path, "an array", list ? *list : Json());
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Append((*list)[i], JsonPath(list_path, i), steps));
    }
    return absl::OkStatus();
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type"}));
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* form = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                   : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                   : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                    : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status) || form == nullptr) {
      return absl::InternalError(JsonPath(path, "type") + ": ICU " + type +
                                 " normalizer unavailable: " + u_errorName(status));
    }
    Step s{Kind::kUnicode};
    s.unicode_form = form;
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "Prepend") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "prepend"}));
    Step s{Kind::kPrepend};
    ASSIGN_OR_RETURN(s.text, ReadString(j, path, "prepend"));
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "Replace") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "pattern", "content"}));
    Step s{Kind::kReplace};
    const Json* pattern = FindField(j, "pattern");
    if (pattern == nullptr) return absl::InvalidArgumentError(JsonPath(path, "pattern") + " is missing");
    ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(*pattern, JsonPath(path, "pattern")));
    s.pattern = std::make_shared<const Pattern>(std::move(p));
    ASSIGN_OR_RETURN(s.text, ReadString(j, path, "content"));
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  return UnsupportedType(path, type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
}

std::string_view Normalizer::Normalize(std::string_view text, std::string* buffer) const {
  std::string_view cur = text;
  bool cur_in_buffer = false;
  std::string other;
  for (const Step& step : steps_) {
    // Each step writes into the buffer that `cur` does not use.
    std::string* out = cur_in_buffer ? &other : buffer;
    switch (step.kind) {
      case Kind::kUnicode: {
        if (IsAscii(cur)) continue;  // ASCII is in every normal form
        const auto* form = static_cast<const icu::Normalizer2*>(step.unicode_form);
        const icu::StringPiece piece(cur.data(), static_cast<int32_t>(cur.size()));
        UErrorCode status = U_ZERO_ERROR;
        if (form->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) continue;
        out->clear();
        icu::StringByteSink<std::string> sink(out);
        status = U_ZERO_ERROR;
        form->normalizeUTF8(0, piece, sink, nullptr, status);
        if (U_FAILURE(status)) continue;  // only on allocation failure; keep the text
        break;
      }
      case Kind::kPrepend:
        if (cur.empty()) continue;
        out->assign(step.text);
        out->append(cur);
        break;
      case Kind::kReplace:
        out->clear();
        step.pattern->ReplaceAll(cur, step.text, out);
        break;
    }
    if (out == &other) buffer->swap(other);
    cur = *buffer;
    cur_in_buffer = true;
  }
  return cur;
}

}  // namespace tandem::tokenizer
