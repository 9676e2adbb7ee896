#include "common/yaml_proto.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_util.h"

namespace tandem::common {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Join(const std::string& path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string Quote(absl::string_view text) {
  constexpr size_t kShow = 60;
  if (text.size() > kShow) return absl::StrCat("'", text.substr(0, kShow), "...' (", text.size(), " chars)");
  return absl::StrCat("'", text, "'");
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      return Quote(node.Scalar());
    default:
      return "nothing";
  }
}

absl::Status Bad(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::Status TypeError(const std::string& path, absl::string_view expected, const YAML::Node& node) {
  return Bad(path, absl::StrCat("expected ", expected, ", got ", Describe(node)));
}

std::string FormatNumber(double v) {
  if (std::abs(v) < 1e15 && v == std::floor(v)) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

absl::Status CheckNumber(const std::string& path, double v, const ConfigKey* rule) {
  if (!std::isfinite(v)) return Bad(path, absl::StrCat("must be a finite number, got ", v));
  if (rule == nullptr) return absl::OkStatus();
  if (rule->min_exclusive ? !(v > rule->min) : !(v >= rule->min)) {
    return Bad(path, absl::StrCat("must be ", rule->min_exclusive ? "> " : ">= ", FormatNumber(rule->min), ", got ",
                                  FormatNumber(v)));
  }
  if (!(v <= rule->max)) {
    return Bad(path, absl::StrCat("must be <= ", FormatNumber(rule->max), ", got ", FormatNumber(v)));
  }
  return absl::OkStatus();
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), as protobuf requires of string fields.
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 1, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 2, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    i += n + 1;
  }
  return true;
}

absl::Status CheckString(const std::string& path, absl::string_view s, const ConfigKey* rule) {
  size_t max_len = rule ? rule->max_len : 4096;
  if (s.size() > max_len) {
    return Bad(path, absl::StrCat("too long (", s.size(), " chars; at most ", max_len, ")"));
  }
  // Invalid bytes would be printed back as U+FFFD and fail protobuf's own
  // check when the message is sent.
  if (!IsValidUtf8(s)) return Bad(path, "is not valid UTF-8");
  if (rule && !rule->one_of.empty()) {
    for (auto allowed : rule->one_of) {
      if (s == allowed) return absl::OkStatus();
    }
    std::vector<std::string> shown;
    for (auto a : rule->one_of) shown.push_back(a.empty() ? "\"\"" : std::string(a));
    return Bad(path, absl::StrCat(Quote(s), " is not allowed; allowed: ", absl::StrJoin(shown, ", ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseInteger(const std::string& path, const YAML::Node& node) {
  if (!node.IsScalar()) return TypeError(path, "an integer", node);
  const std::string& text = node.Scalar();
  int64_t v = 0;
  if (absl::SimpleAtoi(text, &v)) return v;
  double d = 0;
  if (absl::SimpleAtod(text, &d) && std::isfinite(d) && d == std::floor(d) && std::abs(d) <= 9.0e18) {
    return static_cast<int64_t>(d);  // "1e9"
  }
  if (absl::SimpleAtod(text, &d) && std::isfinite(d) && std::abs(d) > 9.0e18) {
    return Bad(path, absl::StrCat("integer out of range, got ", Quote(text)));
  }
  return TypeError(path, "an integer", node);
}

absl::StatusOr<uint64_t> ParseUnsigned(const std::string& path, const YAML::Node& node) {
  if (!node.IsScalar()) return TypeError(path, "a non-negative integer", node);
  uint64_t v = 0;
  if (absl::SimpleAtoi(node.Scalar(), &v)) return v;
  return TypeError(path, "a non-negative integer", node);
}

absl::StatusOr<double> ParseDouble(const std::string& path, const YAML::Node& node) {
  if (!node.IsScalar()) return TypeError(path, "a number", node);
  double d = 0;
  std::string lower = absl::AsciiStrToLower(node.Scalar());
  if (lower == ".inf" || lower == "+.inf" || lower == "-.inf" || lower == ".nan") {
    return Bad(path, absl::StrCat("must be a finite number, got ", Quote(node.Scalar())));
  }
  if (!absl::SimpleAtod(node.Scalar(), &d)) return TypeError(path, "a number", node);
  if (!std::isfinite(d)) return Bad(path, absl::StrCat("must be a finite number, got ", Quote(node.Scalar())));
  return d;
}

absl::StatusOr<bool> ParseBool(const std::string& path, const YAML::Node& node) {
  if (!node.IsScalar()) return TypeError(path, "true or false", node);
  std::string t = absl::AsciiStrToLower(node.Scalar());
  if (t == "true" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "no" || t == "off") return false;
  return TypeError(path, "true or false", node);
}

std::string EnumAllowed(const EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() == 0) continue;
    names.push_back(EnumYamlName(e->value(i)));
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<const EnumValueDescriptor*> ParseEnum(const std::string& path, const YAML::Node& node,
                                                     const EnumDescriptor* e) {
  if (!node.IsScalar()) return TypeError(path, absl::StrCat("one of ", EnumAllowed(e)), node);
  std::string want = absl::AsciiStrToLower(node.Scalar());
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() != 0 && EnumYamlName(e->value(i)) == want) return e->value(i);
  }
  return Bad(path, absl::StrCat(Quote(node.Scalar()), " is not allowed; allowed: ", EnumAllowed(e)));
}

// Reads one scalar (or one element of a repeated field) into msg.
absl::Status SetValue(const std::string& path, const std::string& proto_path, const YAML::Node& node, Message* msg,
                      const FieldDescriptor* f, const YamlProtoOptions& options) {
  const Reflection* r = msg->GetReflection();
  const ConfigKey* rule = options.FindRule(proto_path);
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      ASSIGN_OR_RETURN(int64_t v, ParseInteger(path, node));
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
        return Bad(path, absl::StrCat("must be <= ", std::numeric_limits<int32_t>::max(), ", got ", v));
      }
      RETURN_IF_ERROR(CheckNumber(path, static_cast<double>(v), rule));
      rep ? r->AddInt32(msg, f, v) : r->SetInt32(msg, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      ASSIGN_OR_RETURN(int64_t v, ParseInteger(path, node));
      RETURN_IF_ERROR(CheckNumber(path, static_cast<double>(v), rule));
      rep ? r->AddInt64(msg, f, v) : r->SetInt64(msg, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      ASSIGN_OR_RETURN(uint64_t v, ParseUnsigned(path, node));
      RETURN_IF_ERROR(CheckNumber(path, static_cast<double>(v), rule));
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
        if (v > std::numeric_limits<uint32_t>::max()) return Bad(path, "integer out of range");
        rep ? r->AddUInt32(msg, f, v) : r->SetUInt32(msg, f, v);
      } else {
        rep ? r->AddUInt64(msg, f, v) : r->SetUInt64(msg, f, v);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      ASSIGN_OR_RETURN(double v, ParseDouble(path, node));
      RETURN_IF_ERROR(CheckNumber(path, v, rule));
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        rep ? r->AddDouble(msg, f, v) : r->SetDouble(msg, f, v);
      } else {
        rep ? r->AddFloat(msg, f, v) : r->SetFloat(msg, f, v);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      ASSIGN_OR_RETURN(bool v, ParseBool(path, node));
      rep ? r->AddBool(msg, f, v) : r->SetBool(msg, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      if (!node.IsScalar()) return TypeError(path, "a string", node);
      RETURN_IF_ERROR(CheckString(path, node.Scalar(), rule));
      rep ? r->AddString(msg, f, node.Scalar()) : r->SetString(msg, f, node.Scalar());
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      ASSIGN_OR_RETURN(const EnumValueDescriptor* v, ParseEnum(path, node, f->enum_type()));
      rep ? r->AddEnum(msg, f, v) : r->SetEnum(msg, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return Bad(path, "unsupported field type");
}

absl::Status ReadField(const std::string& path, const std::string& proto_path, const YAML::Node& value, Message* msg,
                       const FieldDescriptor* f, const YamlProtoOptions& options) {
  const Reflection* r = msg->GetReflection();
  if (f->is_map()) return Bad(path, "maps are not supported in files");
  if (f->is_repeated()) {
    if (value.IsNull()) {
      r->ClearField(msg, f);
      return absl::OkStatus();
    }
    if (!value.IsSequence()) return TypeError(path, "a list", value);
    const ConfigKey* rule = options.FindRule(proto_path);
    size_t max_len = rule ? rule->max_len : 4096;
    if (value.size() > max_len) {
      return Bad(path, absl::StrCat("too many elements (", value.size(), "; at most ", max_len, ")"));
    }
    if (rule != nullptr && rule->non_empty && value.size() == 0) {
      return Bad(path, "an empty list (leave the key out for the default)");
    }
    r->ClearField(msg, f);
    for (size_t i = 0; i < value.size(); ++i) {
      std::string p = absl::StrCat(path, "[", i, "]");
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        RETURN_IF_ERROR(YamlToProto(value[i], r->AddMessage(msg, f), options, proto_path));
      } else {
        RETURN_IF_ERROR(SetValue(p, proto_path, value[i], msg, f, options));
      }
    }
    return absl::OkStatus();
  }
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    return YamlToProto(value, r->MutableMessage(msg, f), options, path);
  }
  if (value.IsNull()) return TypeError(path, "a value", value);
  return SetValue(path, proto_path, value, msg, f, options);
}

}  // namespace

const ConfigKey* YamlProtoOptions::FindRule(absl::string_view proto_path) const {
  for (const auto& rule : rules) {
    if (rule.path == proto_path) return &rule;
  }
  return nullptr;
}

std::string EnumYamlName(const EnumValueDescriptor* value) {
  if (value == nullptr) return "unknown";  // a number the enum does not declare
  const EnumDescriptor* e = value->type();
  std::string prefix;
  for (int i = 0; i < e->value_count(); ++i) {
    if (e->value(i)->number() == 0) {
      const std::string& n = e->value(i)->name();
      auto pos = n.rfind("UNSPECIFIED");
      if (pos != std::string::npos) prefix = n.substr(0, pos);
    }
  }
  std::string name = value->name();
  if (!prefix.empty() && name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return absl::AsciiStrToLower(name);
}

std::string DisplayPath(const YamlProtoOptions& options, const std::string& proto_path) {
  for (const auto& [msg_path, vmaps] : options.virtual_maps) {
    for (const auto& [vkey, fields] : vmaps) {
      for (const auto& [yaml_key, field] : fields) {
        if (Join(msg_path, field) == proto_path) return Join(Join(msg_path, vkey), yaml_key);
      }
    }
  }
  return proto_path;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open file"));
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  if (static_cast<size_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file too large (", size, " bytes; at most ", max_bytes, ")"));
  }
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  if (!in) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text;
}

absl::StatusOr<YAML::Node> ParseYaml(absl::string_view text, absl::string_view what, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": too large (", text.size(), " bytes; at most ", max_bytes, ")"));
  }
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed YAML: line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed YAML: ", e.what()));
  }
}

absl::Status ApplyYamlOverride(YAML::Node& root, absl::string_view assignment) {
  auto eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", Quote(assignment), ": expected key.path=value"));
  }
  std::string key(assignment.substr(0, eq));
  std::string value_text(assignment.substr(eq + 1));
  if (key.size() > 512 || value_text.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", Quote(key), ": too long"));
  }
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  for (const auto& p : parts) {
    if (p.empty()) return absl::InvalidArgumentError(absl::StrCat("--set ", Quote(key), ": empty key segment"));
  }
  try {
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception&) {
      value = YAML::Node(value_text);
    }
    if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) return absl::InvalidArgumentError("--set: the document is not a map");
    YAML::Node cur = root;
    std::string walked;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      walked = Join(walked, parts[i]);
      YAML::Node next = cur[parts[i]];
      if (!next.IsDefined() || next.IsNull()) {
        cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
        next = cur[parts[i]];
      } else if (!next.IsMap()) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": ", walked, " is not a map"));
      }
      cur.reset(next);
    }
    cur[parts.back()] = value;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", key, ": ", e.msg));
  }
  return absl::OkStatus();
}

absl::Status YamlToProto(const YAML::Node& node, Message* msg, const YamlProtoOptions& options,
                         const std::string& path) {
  const std::string shown = path.empty() ? "document" : path;
  try {
    if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return TypeError(shown, "a map", node);
    const Descriptor* d = msg->GetDescriptor();
    auto alias_it = options.aliases.find(path);
    auto ignored_it = options.ignored.find(path);
    auto virtual_it = options.virtual_maps.find(path);
    std::set<std::string> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) return Bad(shown, "keys must be strings");
      const std::string key = kv.first.Scalar();
      const std::string key_path = Join(path, key);
      if (key.size() > 256) return Bad(shown, "key too long");
      if (!seen.insert(key).second) return Bad(key_path, "duplicate key");
      std::string field_name = key;
      if (alias_it != options.aliases.end()) {
        auto a = alias_it->second.find(key);
        if (a != alias_it->second.end()) field_name = a->second;
      }
      if (virtual_it != options.virtual_maps.end()) {
        auto v = virtual_it->second.find(key);
        if (v != virtual_it->second.end()) {
          const YAML::Node& sub = kv.second;
          if (sub.IsNull()) continue;
          if (!sub.IsMap()) return TypeError(key_path, "a map", sub);
          for (const auto& skv : sub) {
            const std::string skey = skv.first.Scalar();
            auto fit = v->second.find(skey);
            if (fit == v->second.end()) {
              std::vector<std::string> allowed;
              for (const auto& [k, unused] : v->second) allowed.push_back(k);
              return Bad(Join(key_path, skey), absl::StrCat("unknown key; allowed: ", absl::StrJoin(allowed, ", ")));
            }
            const FieldDescriptor* f = d->FindFieldByName(fit->second);
            if (f == nullptr) return Bad(Join(key_path, skey), "internal: no such field");
            RETURN_IF_ERROR(ReadField(Join(key_path, skey), Join(path, f->name()), skv.second, msg, f, options));
          }
          continue;
        }
      }
      const FieldDescriptor* f = d->FindFieldByName(field_name);
      if (f == nullptr) {
        if (ignored_it != options.ignored.end() && ignored_it->second.count(key)) continue;
        std::vector<std::string> allowed;
        for (int i = 0; i < d->field_count(); ++i) allowed.push_back(d->field(i)->name());
        if (virtual_it != options.virtual_maps.end()) {
          for (const auto& [vk, unused] : virtual_it->second) allowed.push_back(vk);
          // Fields reachable only through a virtual map are not listed directly.
          std::set<std::string> hidden;
          for (const auto& [vk, fields] : virtual_it->second)
            for (const auto& [k, field] : fields) hidden.insert(field);
          std::erase_if(allowed, [&](const std::string& a) { return hidden.count(a) > 0; });
        }
        return Bad(key_path, absl::StrCat("unknown key; allowed: ", absl::StrJoin(allowed, ", ")));
      }
      RETURN_IF_ERROR(ReadField(key_path, Join(path, f->name()), kv.second, msg, f, options));
    }
  } catch (const YAML::Exception& e) {
    return Bad(shown, absl::StrCat("malformed YAML: ", e.msg));
  }
  return absl::OkStatus();
}

absl::Status CheckProtoRules(const Message& msg, const YamlProtoOptions& options, const std::string& path) {
  const Descriptor* d = msg.GetDescriptor();
  const Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string fp = Join(path, f->name());
    const std::string shown = DisplayPath(options, fp);
    const ConfigKey* rule = options.FindRule(fp);
    if (f->is_map()) continue;
    if (f->is_repeated()) {
      int n = r->FieldSize(msg, f);
      size_t max_len = rule ? rule->max_len : 4096;
      if (static_cast<size_t>(n) > max_len) {
        return Bad(shown, absl::StrCat("too many elements (", n, "; at most ", max_len, ")"));
      }
      for (int j = 0; j < n; ++j) {
        std::string ep = absl::StrCat(shown, "[", j, "]");
        switch (f->cpp_type()) {
          case FieldDescriptor::CPPTYPE_INT32:
            RETURN_IF_ERROR(CheckNumber(ep, r->GetRepeatedInt32(msg, f, j), rule));
            break;
          case FieldDescriptor::CPPTYPE_INT64:
            RETURN_IF_ERROR(CheckNumber(ep, static_cast<double>(r->GetRepeatedInt64(msg, f, j)), rule));
            break;
          case FieldDescriptor::CPPTYPE_DOUBLE:
            RETURN_IF_ERROR(CheckNumber(ep, r->GetRepeatedDouble(msg, f, j), rule));
            break;
          case FieldDescriptor::CPPTYPE_STRING:
            RETURN_IF_ERROR(CheckString(ep, r->GetRepeatedString(msg, f, j), rule));
            break;
          case FieldDescriptor::CPPTYPE_MESSAGE:
            RETURN_IF_ERROR(CheckProtoRules(r->GetRepeatedMessage(msg, f, j), options, fp));
            break;
          case FieldDescriptor::CPPTYPE_ENUM: {
            const int number = r->GetRepeatedEnumValue(msg, f, j);
            if (f->enum_type()->FindValueByNumber(number) == nullptr) {
              return Bad(ep, absl::StrCat(number, " is not allowed; allowed: ", EnumAllowed(f->enum_type())));
            }
            break;
          }
          default:
            break;
        }
      }
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        RETURN_IF_ERROR(CheckNumber(shown, r->GetInt32(msg, f), rule));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        RETURN_IF_ERROR(CheckNumber(shown, static_cast<double>(r->GetInt64(msg, f)), rule));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        RETURN_IF_ERROR(CheckNumber(shown, r->GetUInt32(msg, f), rule));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        RETURN_IF_ERROR(CheckNumber(shown, static_cast<double>(r->GetUInt64(msg, f)), rule));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        RETURN_IF_ERROR(CheckNumber(shown, r->GetDouble(msg, f), rule));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        RETURN_IF_ERROR(CheckNumber(shown, r->GetFloat(msg, f), rule));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        RETURN_IF_ERROR(CheckString(shown, r->GetString(msg, f), rule));
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        // Proto3 enums are open: a message from the network may carry any
        // number. Only the declared values go any further.
        const int number = r->GetEnumValue(msg, f);
        const EnumValueDescriptor* v = f->enum_type()->FindValueByNumber(number);
        if (v == nullptr) {
          return Bad(shown, absl::StrCat(number, " is not allowed; allowed: ", EnumAllowed(f->enum_type())));
        }
        if (v->number() == 0 && rule != nullptr && rule->min >= 1) {
          return Bad(shown, absl::StrCat("required; allowed: ", EnumAllowed(f->enum_type())));
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (r->HasField(msg, f)) RETURN_IF_ERROR(CheckProtoRules(r->GetMessage(msg, f), options, fp));
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::common

namespace tandem::common {
namespace {

void EmitScalar(YAML::Emitter& out, const google::protobuf::Message& msg, const google::protobuf::FieldDescriptor* f,
                int index) {
  using google::protobuf::FieldDescriptor;
  const auto* r = msg.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      out << (rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      out << (rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      out << (rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      out << (rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out << (rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      out << (rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out << (rep ? r->GetRepeatedBool(msg, f, index) : r->GetBool(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      out << YAML::DoubleQuoted << (rep ? r->GetRepeatedString(msg, f, index) : r->GetString(msg, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out << EnumYamlName(rep ? r->GetRepeatedEnum(msg, f, index) : r->GetEnum(msg, f));
      break;
    default:
      out << YAML::Null;
      break;
  }
}

void EmitMessage(YAML::Emitter& out, const google::protobuf::Message& msg, const YamlProtoOptions& options,
                 const std::string& path) {
  using google::protobuf::FieldDescriptor;
  const auto* d = msg.GetDescriptor();
  const auto* r = msg.GetReflection();
  std::map<std::string, std::pair<std::string, std::string>> virtual_fields;  // field -> (vkey, ykey)
  auto vit = options.virtual_maps.find(path);
  if (vit != options.virtual_maps.end()) {
    for (const auto& [vkey, fields] : vit->second)
      for (const auto& [ykey, field] : fields) virtual_fields[field] = {vkey, ykey};
  }
  out << YAML::BeginMap;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map() || virtual_fields.count(f->name())) continue;
    if (f->is_repeated()) {
      // A key whose empty list is an error is left out when empty (its
      // default).
      const ConfigKey* rule = options.FindRule(Join(path, f->name()));
      if (rule != nullptr && rule->non_empty && r->FieldSize(msg, f) == 0) continue;
      out << YAML::Key << f->name() << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (int j = 0; j < r->FieldSize(msg, f); ++j) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          EmitMessage(out, r->GetRepeatedMessage(msg, f, j), options, Join(path, f->name()));
        } else {
          EmitScalar(out, msg, f, j);
        }
      }
      out << YAML::EndSeq;
      continue;
    }
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!r->HasField(msg, f)) continue;
      out << YAML::Key << f->name() << YAML::Value;
      EmitMessage(out, r->GetMessage(msg, f), options, Join(path, f->name()));
      continue;
    }
    out << YAML::Key << f->name() << YAML::Value;
    EmitScalar(out, msg, f, -1);
  }
  if (vit != options.virtual_maps.end()) {
    for (const auto& [vkey, fields] : vit->second) {
      out << YAML::Key << vkey << YAML::Value << YAML::BeginMap;
      for (const auto& [ykey, field] : fields) {
        out << YAML::Key << ykey << YAML::Value;
        EmitScalar(out, msg, d->FindFieldByName(field), -1);
      }
      out << YAML::EndMap;
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string ProtoToYaml(const google::protobuf::Message& msg, const YamlProtoOptions& options) {
  YAML::Emitter out;
  EmitMessage(out, msg, options, "");
  return std::string(out.c_str()) + "\n";
}

}  // namespace tandem::common
