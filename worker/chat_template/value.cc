// One file on purpose: the Value type's constructors, Python semantics
// (equality, ordering, truth, repr, str) and JSON conversion (value.h).
#include "worker/chat_template/value.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/text.h"

namespace tandem::chat_template {
namespace {

absl::Status TooDeep() {
  return absl::InvalidArgumentError(absl::StrCat("value nests more than ", kMaxValueDepth, " containers deep"));
}

int MaxDepth(const std::vector<Value>& items) {
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  return d;
}

// Python's exact comparison of two numbers (bool, int or float).
int CompareNumbers(const Value& a, const Value& b) {
  if (a.is_integer_like() && b.is_integer_like()) {
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  const long double x = a.is_integer_like() ? static_cast<long double>(a.as_int()) : a.as_double();
  const long double y = b.is_integer_like() ? static_cast<long double>(b.as_int()) : b.as_double();
  if (x < y) return -1;
  if (x > y) return 1;
  return 0;
}

bool NumbersEqual(const Value& a, const Value& b) {
  if (!a.is_integer_like() && std::isnan(a.as_double())) return false;
  if (!b.is_integer_like() && std::isnan(b.as_double())) return false;
  return CompareNumbers(a, b) == 0;
}

bool EqualsAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) return false;
  if (a.is_number() && b.is_number()) return NumbersEqual(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.str() == b.str();
    case Kind::kList: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      if (x.kind != y.kind || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!EqualsAt(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !EqualsAt(v, *other, depth + 1)) return false;
      }
      return true;
    }
    default:
      return a.SameObject(b);
  }
}

absl::StatusOr<std::string> ReprAt(const Value& v, int depth);

absl::StatusOr<std::string> ReprItems(const std::vector<Value>& items, int depth) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.append(", ");
    ASSIGN_OR_RETURN(std::string r, ReprAt(items[i], depth + 1));
    out.append(r);
  }
  return out;
}

absl::StatusOr<std::string> ReprDict(const DictData& d, int depth) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, item] : d.items()) {
    if (!first) out.append(", ");
    first = false;
    out.append(text::ReprString(k));
    out.append(": ");
    ASSIGN_OR_RETURN(std::string r, ReprAt(item, depth + 1));
    out.append(r);
  }
  out.append("}");
  return out;
}

absl::Status NotPrintable(const Value& v) {
  return absl::UnimplementedError(absl::StrCat(
      "cannot print a ", TypeName(v), " object (Python prints its memory address); convert it first, e.g. with |list"));
}

absl::StatusOr<std::string> ReprAt(const Value& v, int depth) {
  if (depth > kMaxValueDepth) return TooDeep();
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::string("Undefined");
    case Kind::kString:
      return text::ReprString(v.str());
    case Kind::kList: {
      const ListData& l = v.list();
      ASSIGN_OR_RETURN(std::string inner, ReprItems(l.items, depth));
      switch (l.kind) {
        case SeqKind::kList:
          return absl::StrCat("[", inner, "]");
        case SeqKind::kTuple:
          return absl::StrCat("(", inner, l.items.size() == 1 ? ",)" : ")");
        case SeqKind::kRange:
          return l.range_repr;
        case SeqKind::kDictKeys:
          return absl::StrCat("dict_keys([", inner, "])");
        case SeqKind::kDictValues:
          return absl::StrCat("dict_values([", inner, "])");
        case SeqKind::kDictItems:
          return absl::StrCat("dict_items([", inner, "])");
      }
      return inner;
    }
    case Kind::kDict:
      return ReprDict(v.dict(), depth);
    case Kind::kNamespace: {
      ASSIGN_OR_RETURN(std::string inner, ReprDict(v.ns(), depth));
      return absl::StrCat("<Namespace ", inner, ">");
    }
    case Kind::kIterator:
    case Kind::kObject:
    case Kind::kCallable:
      return NotPrintable(v);
    default:
      return ToStr(v);
  }
}

absl::Status NotSerializable(const Value& v) {
  return absl::InvalidArgumentError(absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
}

struct JsonWriter {
  const JsonOptions& options;
  std::string item_sep;
  std::string key_sep;
  std::string out;

  void Newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out.append(*options.indent);
  }

  absl::Status Write(const Value& v, int level) {
    if (level > kMaxValueDepth) return TooDeep();
    switch (v.kind()) {
      case Kind::kNone:
        out.append("null");
        return absl::OkStatus();
      case Kind::kBool:
        out.append(v.as_bool() ? "true" : "false");
        return absl::OkStatus();
      case Kind::kInt:
        absl::StrAppend(&out, v.as_int());
        return absl::OkStatus();
      case Kind::kFloat: {
        const double d = v.as_double();
        if (std::isnan(d)) {
          out.append("NaN");
        } else if (std::isinf(d)) {
          out.append(d > 0 ? "Infinity" : "-Infinity");
        } else {
          out.append(text::ReprFloat(d));
        }
        return absl::OkStatus();
      }
      case Kind::kString:
        text::AppendJsonString(v.str(), options.ensure_ascii, &out);
        return absl::OkStatus();
      case Kind::kList: {
        const ListData& l = v.list();
        if (l.kind != SeqKind::kList && l.kind != SeqKind::kTuple) return NotSerializable(v);
        if (l.items.empty()) {
          out.append("[]");
          return absl::OkStatus();
        }
        out.push_back('[');
        for (size_t i = 0; i < l.items.size(); ++i) {
          if (i > 0) out.append(item_sep);
          if (options.indent) Newline(level + 1);
          RETURN_IF_ERROR(Write(l.items[i], level + 1));
        }
        if (options.indent) Newline(level);
        out.push_back(']');
        return absl::OkStatus();
      }
      case Kind::kDict: {
        const DictData& d = v.dict();
        if (d.size() == 0) {
          out.append("{}");
          return absl::OkStatus();
        }
        std::vector<const std::pair<std::string, Value>*> items;
        for (const auto& kv : d.items()) items.push_back(&kv);
        if (options.sort_keys) {
          std::stable_sort(items.begin(), items.end(),
                           [](const auto* a, const auto* b) { return a->first < b->first; });
        }
        out.push_back('{');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out.append(item_sep);
          if (options.indent) Newline(level + 1);
          text::AppendJsonString(items[i]->first, options.ensure_ascii, &out);
          out.append(key_sep);
          RETURN_IF_ERROR(Write(items[i]->second, level + 1));
        }
        if (options.indent) Newline(level);
        out.push_back('}');
        return absl::OkStatus();
      }
      default:
        return NotSerializable(v);
    }
  }
};

absl::StatusOr<Value> FromJsonAt(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) return TooDeep();
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) {
        return absl::InvalidArgumentError(absl::StrCat("integer ", u, " is too large"));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictData>();
      for (const auto& [k, e] : j.items()) {
        ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        d->Set(k, std::move(v));
      }
      return Value::Dict(std::move(d));
    }
    default:
      return absl::InvalidArgumentError("unsupported JSON value (binary)");
  }
}

}  // namespace

const Value* DictData::Find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void DictData::Set(const std::string& key, Value value) {
  depth_ = std::max(depth_, value.depth() + 1);
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(value));
}

void DictData::Clear() {
  items_.clear();
  index_.clear();
  depth_ = 1;
}

Value Value::Undefined(std::string message) {
  Value v;
  v.rep_ = UndefRep{std::make_shared<const std::string>(std::move(message))};
  return v;
}

Value Value::None() {
  Value v;
  v.rep_ = NoneRep{};
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.rep_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.rep_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.rep_ = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.rep_ = StrRep{std::make_shared<const std::string>(std::move(s))};
  return v;
}

Value Value::List(std::vector<Value> items, SeqKind kind) {
  auto l = std::make_shared<ListData>();
  l->kind = kind;
  l->depth = MaxDepth(items) + 1;
  l->items = std::move(items);
  Value v;
  v.rep_ = ListRep{std::move(l)};
  return v;
}

Value Value::Range(std::vector<Value> items, std::string repr) {
  auto l = std::make_shared<ListData>();
  l->kind = SeqKind::kRange;
  l->items = std::move(items);
  l->range_repr = std::move(repr);
  Value v;
  v.rep_ = ListRep{std::move(l)};
  return v;
}

Value Value::Dict(std::shared_ptr<const DictData> d) {
  Value v;
  v.rep_ = DictRep{std::move(d)};
  return v;
}

Value Value::Namespace(std::shared_ptr<DictData> d) {
  Value v;
  v.rep_ = NsRep{std::move(d)};
  return v;
}

Value Value::Iterator(std::string type_name, std::vector<Value> items) {
  auto it = std::make_shared<IteratorData>();
  it->type_name = std::move(type_name);
  it->items = std::move(items);
  Value v;
  v.rep_ = IterRep{std::move(it)};
  return v;
}

Value Value::Object(std::shared_ptr<const ObjectData> o) {
  Value v;
  v.rep_ = ObjRep{std::move(o)};
  return v;
}

Value Value::Callable(std::string name, NativeFunction fn) {
  auto c = std::make_shared<CallableData>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  Value v;
  v.rep_ = CallRep{std::move(c)};
  return v;
}

absl::StatusOr<Value> Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 1); }

bool Value::is_number() const {
  const Kind k = kind();
  return k == Kind::kBool || k == Kind::kInt || k == Kind::kFloat;
}

int64_t Value::as_int() const {
  if (kind() == Kind::kBool) return as_bool() ? 1 : 0;
  return std::get<int64_t>(rep_);
}

double Value::as_double() const {
  if (kind() == Kind::kFloat) return std::get<double>(rep_);
  return static_cast<double>(as_int());
}

std::string Value::undefined_message() const {
  const auto& m = std::get<UndefRep>(rep_).message;
  return m ? *m : std::string("value is undefined");
}

int Value::depth() const {
  switch (kind()) {
    case Kind::kList:
      return list().depth;
    case Kind::kDict:
      return dict().depth();
    case Kind::kNamespace:
      return ns().depth();
    default:
      return 0;
  }
}

bool Value::SameObject(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kNamespace:
      return &ns() == &other.ns();
    case Kind::kIterator:
      return &iter() == &other.iter();
    case Kind::kObject:
      return &object() == &other.object();
    case Kind::kCallable:
      return &callable() == &other.callable();
    case Kind::kList:
      return &list() == &other.list();
    case Kind::kDict:
      return &dict() == &other.dict();
    default:
      return false;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      switch (v.list().kind) {
        case SeqKind::kList:
          return "list";
        case SeqKind::kTuple:
          return "tuple";
        case SeqKind::kRange:
          return "range";
        case SeqKind::kDictKeys:
          return "dict_keys";
        case SeqKind::kDictValues:
          return "dict_values";
        case SeqKind::kDictItems:
          return "dict_items";
      }
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kIterator:
      return v.iter().type_name;
    case Kind::kObject:
      return v.object().type_name;
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int() != 0;
    case Kind::kFloat:
      return v.as_double() != 0.0;
    case Kind::kString:
      return !v.str().empty();
    case Kind::kList:
      return !v.list().items.empty();
    case Kind::kDict:
      return v.dict().size() > 0;
    default:
      return true;
  }
}

absl::StatusOr<std::string> ToStr(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::string();
    case Kind::kNone:
      return std::string("None");
    case Kind::kBool:
      return std::string(v.as_bool() ? "True" : "False");
    case Kind::kInt:
      return absl::StrCat(v.as_int());
    case Kind::kFloat:
      return text::ReprFloat(v.as_double());
    case Kind::kString:
      return v.str();
    default:
      return ReprAt(v, 0);
  }
}

absl::StatusOr<std::string> Repr(const Value& v) { return ReprAt(v, 0); }

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

absl::StatusOr<int> Compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError((a.is_undefined() ? a : b).undefined_message());
  }
  if (a.is_number() && b.is_number()) {
    const bool nan =
        (!a.is_integer_like() && std::isnan(a.as_double())) || (!b.is_integer_like() && std::isnan(b.as_double()));
    // Every ordering comparison with NaN is false: report "unordered" as 2.
    if (nan) return 2;
    return CompareNumbers(a, b);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.kind() == Kind::kList && b.kind() == Kind::kList && a.list().kind == b.list().kind &&
      (a.list().kind == SeqKind::kList || a.list().kind == SeqKind::kTuple)) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", AV(op), "' not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  JsonWriter w{options, options.indent ? "," : ", ", ": ", {}};
  if (options.separators) {
    w.item_sep = options.separators->first;
    w.key_sep = options.separators->second;
  }
  RETURN_IF_ERROR(w.Write(v, 0));
  return std::move(w.out);
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return std::vector<Value>{};
    case Kind::kString: {
      std::vector<Value> out;
      const std::string& s = v.str();
      size_t i = 0;
      while (i < s.size()) {
        size_t j = i + 1;
        while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) ++j;
        out.push_back(Value::String(s.substr(i, j - i)));
        i = j;
      }
      return out;
    }
    case Kind::kList:
      return v.list().items;
    case Kind::kDict: {
      std::vector<Value> out;
      for (const auto& kv : v.dict().items()) out.push_back(Value::String(kv.first));
      return out;
    }
    case Kind::kIterator: {
      IteratorData& it = v.iter();
      std::vector<Value> out(it.items.begin() + static_cast<std::ptrdiff_t>(it.pos), it.items.end());
      it.pos = it.items.size();
      if (!it.error.ok()) return it.error;
      return out;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(text::CodePointCount(v.str()));
    case Kind::kList:
      return static_cast<int64_t>(v.list().items.size());
    case Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      return absl::InvalidArgumentError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kDict:
      if (item.kind() == Kind::kList && item.list().kind != SeqKind::kTuple) {
        return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    case Kind::kIterator: {
      IteratorData& it = container.iter();
      while (it.pos < it.items.size()) {
        if (Equals(it.items[it.pos++], item)) return true;
      }
      if (!it.error.ok()) return it.error;
      return false;
    }
    case Kind::kList: {
      const ListData& l = container.list();
      if (l.kind == SeqKind::kDictKeys && item.kind() == Kind::kList && item.list().kind != SeqKind::kTuple) {
        return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", TypeName(item), "'"));
      }
      for (const Value& e : l.items) {
        if (Equals(e, item)) return true;
      }
      return false;
    }
    case Kind::kUndefined:
      return false;
    default:
      return absl::InvalidArgumentError(absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

}  // namespace tandem::chat_template
