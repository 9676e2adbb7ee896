#include "common/config_table.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include <google/protobuf/reflection.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/check.h"
#include "common/base/status_macros.h"

namespace tandem::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

bool UnderOptionalSection(const ConfigTable& table, absl::string_view path) {
  for (const std::string& section : table.optional_sections) {
    if (path.size() > section.size() && path.substr(0, section.size()) == section && path[section.size()] == '.') {
      return true;
    }
  }
  return false;
}

// Every singular sub-message outside the optional sections, so the defaults
// show every section (effective-config logs, JobSpecToYaml).
void CreateSections(const ConfigTable& table, Message* msg, const std::string& path) {
  const Descriptor* d = msg->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string fp = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (table.optional_sections.count(fp) || UnderOptionalSection(table, fp)) continue;
    CreateSections(table, msg->GetReflection()->MutableMessage(msg, f), fp);
  }
}

absl::Status BuildDefaults(const ConfigTable& table, bool all, Message* msg) {
  msg->Clear();
  YAML::Node root(YAML::NodeType::Map);
  for (const ConfigKey& key : table.keys()) {
    if (key.def.empty() || (!all && UnderOptionalSection(table, key.path))) continue;
    RETURN_IF_ERROR(
        ApplyYamlOverride(root, absl::StrCat(DisplayPath(table.options, std::string(key.path)), "=", key.def)));
  }
  RETURN_IF_ERROR(YamlToProto(root, msg, table.options));
  if (!all) CreateSections(table, msg, "");
  return absl::OkStatus();
}

// The message holding the field `path` names and the field; nullptr when a
// message on the way is unset and `create` is false (or it is optional).
std::pair<Message*, const FieldDescriptor*> Resolve(const ConfigTable& table, Message* msg, absl::string_view path) {
  std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    TANDEM_CHECK(f != nullptr && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE);
    walked = walked.empty() ? std::string(parts[i]) : absl::StrCat(walked, ".", parts[i]);
    const Reflection* r = msg->GetReflection();
    if (!r->HasField(*msg, f) && (table.optional_sections.count(walked) || UnderOptionalSection(table, walked))) {
      return {nullptr, nullptr};
    }
    msg = r->MutableMessage(msg, f);
  }
  const FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(std::string(parts.back()));
  TANDEM_CHECK(f != nullptr);
  return {msg, f};
}

const Message* ResolveConst(const Message& msg, const FieldDescriptor** field, absl::string_view path) {
  const Message* m = &msg;
  std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* f = m->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    m = &m->GetReflection()->GetMessage(*m, f);  // the default instance when unset: zeros
  }
  *field = m->GetDescriptor()->FindFieldByName(std::string(parts.back()));
  return m;
}

bool IsZero(const Message& msg, const FieldDescriptor* f) {
  const Reflection* r = msg.GetReflection();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return r->GetInt32(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_INT64:
      return r->GetInt64(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_UINT32:
      return r->GetUInt32(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_UINT64:
      return r->GetUInt64(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return r->GetDouble(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_FLOAT:
      return r->GetFloat(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_BOOL:
      return !r->GetBool(msg, f);
    case FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(msg, f).empty();
    case FieldDescriptor::CPPTYPE_ENUM:
      return r->GetEnumValue(msg, f) == 0;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return !r->HasField(msg, f);
  }
  return false;
}

// Copies one scalar between fields of the same C++ type.
void CopyScalar(const Message& from, const FieldDescriptor* ff, Message* to, const FieldDescriptor* tf) {
  const Reflection* fr = from.GetReflection();
  const Reflection* tr = to->GetReflection();
  switch (tf->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      tr->SetInt32(to, tf, fr->GetInt32(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      tr->SetInt64(to, tf, fr->GetInt64(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      tr->SetUInt32(to, tf, fr->GetUInt32(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      tr->SetUInt64(to, tf, fr->GetUInt64(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      tr->SetDouble(to, tf, fr->GetDouble(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      tr->SetFloat(to, tf, fr->GetFloat(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      tr->SetBool(to, tf, fr->GetBool(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      tr->SetString(to, tf, fr->GetString(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      tr->SetEnumValue(to, tf, fr->GetEnumValue(from, ff));
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

std::string FormatBound(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

std::string ScalarTypeText(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "int";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "float";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "bool";
    case FieldDescriptor::CPPTYPE_STRING:
      return "string";
    case FieldDescriptor::CPPTYPE_ENUM:
      return "enum";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "map";
  }
  return "?";
}

}  // namespace

const FieldDescriptor* FindFieldByPath(const Descriptor* message, absl::string_view path) {
  const FieldDescriptor* f = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (message == nullptr) return nullptr;
    f = message->FindFieldByName(std::string(part));
    if (f == nullptr) return nullptr;
    message = f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ? f->message_type() : nullptr;
  }
  return f;
}

absl::Status CheckConfigTable(const ConfigTable& table) {
  auto bad = [&](const ConfigKey& key, absl::string_view what) {
    return absl::InternalError(absl::StrCat("config table ", table.name, ": ", key.path, ": ", what));
  };
  std::set<absl::string_view> seen;
  for (const ConfigKey& key : table.keys()) {
    if (!seen.insert(key.path).second) return bad(key, "listed twice");
    const FieldDescriptor* f = FindFieldByPath(table.message, key.path);
    if (f == nullptr) return bad(key, "no such field");
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) return bad(key, "names a message, not a key");
    if (key.help.empty()) return bad(key, "no help");
    if (!key.def.empty() + !key.def_from.empty() + !key.doc_default.empty() > 1) {
      return bad(key, "set one of def, def_from and doc_default");
    }
    if (!key.def_from.empty()) {
      const FieldDescriptor* from = FindFieldByPath(table.message, key.def_from);
      if (from == nullptr || from->cpp_type() != f->cpp_type() || from->is_repeated() || f->is_repeated()) {
        return bad(key, absl::StrCat("def_from ", key.def_from, " is not a key of the same type"));
      }
    }
    if (key.zero_is_value && key.def.empty()) return bad(key, "zero_is_value without a default");
  }
  // Every default passes its own row (the reader checks each value read).
  std::unique_ptr<Message> all(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(table.message)->New());
  return BuildDefaults(table, /*all=*/true, all.get());
}

void FinishConfigTable(ConfigTable& table) {
  TANDEM_CHECK(table.message != nullptr);
  TANDEM_CHECK_OK(CheckConfigTable(table));
  const Message* prototype = google::protobuf::MessageFactory::generated_factory()->GetPrototype(table.message);
  std::shared_ptr<Message> defaults(prototype->New());
  std::shared_ptr<Message> values(prototype->New());
  TANDEM_CHECK_OK(BuildDefaults(table, /*all=*/false, defaults.get()));
  TANDEM_CHECK_OK(BuildDefaults(table, /*all=*/true, values.get()));
  table.defaults = std::move(defaults);
  table.values = std::move(values);
}

void SetDefaults(const ConfigTable& table, Message* msg) {
  TANDEM_CHECK(table.defaults != nullptr && msg->GetDescriptor() == table.message);
  msg->CopyFrom(*table.defaults);
}

void ApplyDefaults(const ConfigTable& table, Message* msg) {
  TANDEM_CHECK(table.values != nullptr && msg->GetDescriptor() == table.message);
  for (const ConfigKey& key : table.keys()) {
    if (key.def.empty() || key.zero_is_value) continue;
    auto [holder, f] = Resolve(table, msg, key.path);
    if (holder == nullptr || f->is_repeated() || !IsZero(*holder, f)) continue;
    const FieldDescriptor* vf = nullptr;
    const Message* value = ResolveConst(*table.values, &vf, key.path);
    CopyScalar(*value, vf, holder, f);
  }
  for (const ConfigKey& key : table.keys()) {
    if (key.def_from.empty()) continue;
    auto [holder, f] = Resolve(table, msg, key.path);
    if (holder == nullptr || !IsZero(*holder, f)) continue;
    const FieldDescriptor* ff = nullptr;
    const Message* from = ResolveConst(*msg, &ff, key.def_from);
    CopyScalar(*from, ff, holder, f);
  }
}

std::string DefaultText(const ConfigTable& table, const ConfigKey& key) {
  if (!key.def_from.empty()) return absl::StrCat("= ", DisplayPath(table.options, std::string(key.def_from)));
  if (!key.doc_default.empty()) return std::string(key.doc_default);
  const FieldDescriptor* f = FindFieldByPath(table.message, key.path);
  std::string text;
  if (!key.def.empty()) {
    text = f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? absl::StrCat("`", key.def, "`") : std::string(key.def);
  } else if (f->is_repeated()) {
    text = "[]";
  } else {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_BOOL:
        text = "false";
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        text = "\"\"";
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        text = "required";
        break;
      default:
        text = "0";
        break;
    }
  }
  if (key.zero_is_value) absl::StrAppend(&text, " (zero is literal)");
  return text;
}

std::string AllowedText(const ConfigTable& table, const ConfigKey& key) {
  const FieldDescriptor* f = FindFieldByPath(table.message, key.path);
  std::vector<std::string> parts;
  if (!key.one_of.empty()) {
    std::vector<std::string> shown;
    for (absl::string_view v : key.one_of) shown.push_back(v.empty() ? "\"\"" : std::string(v));
    parts.push_back(absl::StrJoin(shown, ", "));
  } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    std::vector<std::string> shown;
    for (int i = 0; i < f->enum_type()->value_count(); ++i) {
      if (f->enum_type()->value(i)->number() != 0) shown.push_back(EnumYamlName(f->enum_type()->value(i)));
    }
    parts.push_back(absl::StrJoin(shown, ", "));
  } else if (f->cpp_type() != FieldDescriptor::CPPTYPE_STRING && f->cpp_type() != FieldDescriptor::CPPTYPE_BOOL) {
    const bool has_min = key.min > -1e300, has_max = key.max < 1e300;
    if (has_min && has_max) {
      parts.push_back(key.min_exclusive ? absl::StrCat("(", FormatBound(key.min), ", ", FormatBound(key.max), "]")
                                        : absl::StrCat(FormatBound(key.min), "..", FormatBound(key.max)));
    } else if (has_min) {
      parts.push_back(absl::StrCat(key.min_exclusive ? "> " : ">= ", FormatBound(key.min)));
    } else if (has_max) {
      parts.push_back(absl::StrCat("<= ", FormatBound(key.max)));
    }
  }
  if (key.max_len != 4096) {
    parts.push_back(f->is_repeated() ? absl::StrCat("at most ", key.max_len, " elements")
                                     : absl::StrCat("at most ", key.max_len, " characters"));
  }
  return absl::StrJoin(parts, "; ");
}

YamlProtoOptions SectionOptions(const ConfigTable& table, absl::string_view section) {
  const std::string prefix = absl::StrCat(section, ".");
  auto strip = [&](const std::string& path) -> std::optional<std::string> {
    if (path == section) return std::string();
    if (path.rfind(prefix, 0) == 0) return path.substr(prefix.size());
    return std::nullopt;
  };
  YamlProtoOptions out;
  out.max_text_bytes = table.options.max_text_bytes;
  for (const ConfigKey& key : table.keys()) {
    if (absl::string_view(key.path).substr(0, prefix.size()) != prefix) continue;
    ConfigKey k = key;
    k.path = key.path.substr(prefix.size());
    out.rules.push_back(k);
  }
  for (const auto& [path, aliases] : table.options.aliases) {
    if (auto p = strip(path)) out.aliases[*p] = aliases;
  }
  for (const auto& [path, ignored] : table.options.ignored) {
    if (auto p = strip(path)) out.ignored[*p] = ignored;
  }
  return out;
}

std::string TypeText(const ConfigTable& table, const ConfigKey& key) {
  const FieldDescriptor* f = FindFieldByPath(table.message, key.path);
  return f->is_repeated() ? absl::StrCat("list of ", ScalarTypeText(f)) : ScalarTypeText(f);
}

}  // namespace tandem::common
