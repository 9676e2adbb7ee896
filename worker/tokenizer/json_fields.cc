#include "worker/tokenizer/json_fields.h"

#include "absl/strings/str_cat.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

std::string Quote(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q.push_back('"');
  q.append(s);
  q.push_back('"');
  return q;
}

std::string JsonPath(const std::string& parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return parent + "." + std::string(key);
}

std::string JsonPath(const std::string& parent, size_t index) { return absl::StrCat(parent, "[", index, "]"); }

std::string JsonTypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

absl::Status JsonTypeError(const std::string& path, std::string_view expected, const Json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": expected ", std::string(expected), ", got ", JsonTypeName(got)));
}

absl::Status CheckFields(const Json& j, const std::string& path, std::initializer_list<std::string_view> known) {
  if (!j.is_object()) return JsonTypeError(path.empty() ? "(top level)" : path, "an object", j);
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || it.key() == k;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, it.key()), " is not supported (unknown field)"));
    }
  }
  return absl::OkStatus();
}

const Json* FindField(const Json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

absl::StatusOr<bool> ReadBool(const Json& j, const std::string& path, std::string_view key, bool fallback) {
  const Json* v = FindField(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return JsonTypeError(JsonPath(path, key), "a boolean", *v);
  return v->get<bool>();
}

absl::StatusOr<std::string> ReadString(const Json& j, const std::string& path, std::string_view key) {
  const Json* v = FindField(j, key);
  if (v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, key), " is missing"));
  }
  if (!v->is_string()) return JsonTypeError(JsonPath(path, key), "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> ReadOptionalString(const Json& j, const std::string& path,
                                                              std::string_view key) {
  const Json* v = FindField(j, key);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return JsonTypeError(JsonPath(path, key), "a string or null", *v);
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<int64_t> ReadIntValue(const Json& j, const std::string& path, int64_t lo, int64_t hi) {
  int64_t v;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", u, " is out of range [", lo, ", ", hi, "]"));
    }
    v = static_cast<int64_t>(u);
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else {
    return JsonTypeError(path, "an integer", j);
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<int64_t> ReadInt(const Json& j, const std::string& path, std::string_view key, int64_t fallback,
                                int64_t lo, int64_t hi) {
  const Json* v = FindField(j, key);
  if (v == nullptr) return fallback;
  return ReadIntValue(*v, JsonPath(path, key), lo, hi);
}

absl::StatusOr<std::string> ReadChar(const Json& j, const std::string& path, std::string_view key,
                                     std::string_view fallback) {
  const Json* v = FindField(j, key);
  if (v == nullptr) return std::string(fallback);
  if (!v->is_string()) return JsonTypeError(JsonPath(path, key), "a one-character string", *v);
  const std::string s = v->get<std::string>();
  if (s.empty() || Utf8SequenceLength(s) != static_cast<int>(s.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(JsonPath(path, key), ": expected exactly one character, got \"", s, "\""));
  }
  return s;
}

absl::StatusOr<std::string> ReadType(const Json& j, const std::string& path) {
  if (!j.is_object()) return JsonTypeError(path, "an object", j);
  return ReadString(j, path, "type");
}

absl::Status UnsupportedType(const std::string& path, const std::string& type, std::string_view supported) {
  return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "type"), " \"", type,
                                                 "\" is not supported (supported: ", std::string(supported), ")"));
}

absl::Status Annotate(const absl::Status& s, std::string_view prefix) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(std::string(prefix), s.message()));
}

}  // namespace tandem::tokenizer
