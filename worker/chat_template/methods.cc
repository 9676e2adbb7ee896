// Methods of str, dict and list values, and the global functions.
#include <ctime>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/evaluator.h"
#include "worker/chat_template/text.h"

namespace tandem::chat_template {
namespace {

using Method = absl::StatusOr<Value> (*)(Interpreter& interp, const Value& self, CallArgs& args);

absl::Status TypeError(std::string m) { return absl::InvalidArgumentError(std::move(m)); }

absl::StatusOr<std::string> StrArg(std::string_view function, const Value& v) {
  if (!v.is_string()) {
    return TypeError(absl::StrCat(AV(function), "() argument must be str, not ", TypeName(v)));
  }
  return v.str();
}

// Optional str argument: None or absent gives null.
absl::StatusOr<const std::string*> OptStrArg(std::string_view function, const Value& v) {
  if (v.is_none()) return nullptr;
  if (!v.is_string()) {
    return TypeError(absl::StrCat(AV(function), " arg must be None or str"));
  }
  return &v.str();
}

absl::StatusOr<int64_t> IntArg(std::string_view function, const Value& v) {
  if (!v.is_integer_like()) {
    return TypeError(absl::StrCat("'", TypeName(v), "' object cannot be interpreted as an integer"));
  }
  return v.as_int();
}

Value Strings(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(Value::String(p));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> Strip(const Value& self, CallArgs& args, text::StripSide side, std::string_view name) {
  ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"chars"}, {Value::None()}));
  ASSIGN_OR_RETURN(const std::string* chars, OptStrArg(name, a[0]));
  return Value::String(text::Strip(self.str(), side, chars));
}

absl::StatusOr<Value> SplitMethod(Interpreter& interp, const Value& self, CallArgs& args, bool right) {
  const char* name = right ? "rsplit" : "split";
  ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sep", "maxsplit"}, {Value::None(), Value::Int(-1)}));
  ASSIGN_OR_RETURN(const std::string* sep, OptStrArg(name, a[0]));
  ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(name, a[1]));
  if (sep != nullptr && sep->empty()) return absl::InvalidArgumentError("empty separator");
  std::vector<std::string> parts = text::Split(self.str(), sep, maxsplit, right);
  RETURN_IF_ERROR(interp.ChargeList(parts.size()));
  return Strings(parts);
}

absl::StatusOr<Value> AffixTest(const Value& self, CallArgs& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"affix"}, {}));
  std::vector<std::string> options;
  if (a[0].is_string()) {
    options.push_back(a[0].str());
  } else if (a[0].kind() == Kind::kList && a[0].list().kind == SeqKind::kTuple) {
    for (const Value& v : a[0].list().items) {
      if (!v.is_string()) {
        return TypeError(absl::StrCat("tuple for ", name, " must only contain str, not ", TypeName(v)));
      }
      options.push_back(v.str());
    }
  } else {
    return TypeError(absl::StrCat(name, " first arg must be str or a tuple of str, not ", TypeName(a[0])));
  }
  const std::string& s = self.str();
  for (const auto& o : options) {
    if (prefix ? s.starts_with(o) : s.ends_with(o)) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> Find(const Value& self, CallArgs& args, bool right, bool raise, std::string_view name) {
  ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sub"}, {}));
  ASSIGN_OR_RETURN(std::string sub, StrArg(name, a[0]));
  const std::string& s = self.str();
  const size_t pos = right ? s.rfind(sub) : s.find(sub);
  if (pos == std::string::npos) {
    if (raise) return absl::InvalidArgumentError("substring not found");
    return Value::Int(-1);
  }
  return Value::Int(static_cast<int64_t>(text::CodePointIndex(s, pos)));
}

absl::StatusOr<Value> CaseMethod(const Value& self, CallArgs& args, text::CaseOp op, std::string_view name) {
  RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
  ASSIGN_OR_RETURN(std::string s, text::ChangeCase(self.str(), op));
  return Value::String(std::move(s));
}

// str.isxxx() for ASCII text; non-ASCII text is refused (Unicode tables).
absl::StatusOr<Value> CharClass(const Value& self, CallArgs& args, std::string_view name, bool (*pred)(char)) {
  RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
  const std::string& s = self.str();
  if (!text::IsAscii(s)) {
    return absl::UnimplementedError(absl::StrCat("str.", AV(name), "() of non-ASCII text is not supported"));
  }
  if (s.empty()) return Value::Bool(false);
  for (char c : s) {
    if (!pred(c)) return Value::Bool(false);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> StrMethod(Interpreter& interp, const Value& self, std::string_view name, CallArgs& args) {
  using text::CaseOp;
  using text::StripSide;
  if (name == "strip") return Strip(self, args, StripSide::kBoth, name);
  if (name == "lstrip") return Strip(self, args, StripSide::kLeft, name);
  if (name == "rstrip") return Strip(self, args, StripSide::kRight, name);
  if (name == "split") return SplitMethod(interp, self, args, false);
  if (name == "rsplit") return SplitMethod(interp, self, args, true);
  if (name == "splitlines") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"keepends"}, {Value::Bool(false)}));
    std::vector<std::string> parts = text::SplitLines(self.str(), Truthy(a[0]));
    RETURN_IF_ERROR(interp.ChargeList(parts.size()));
    return Strings(parts);
  }
  if (name == "startswith") return AffixTest(self, args, true);
  if (name == "endswith") return AffixTest(self, args, false);
  if (name == "lower") return CaseMethod(self, args, CaseOp::kLower, name);
  if (name == "upper") return CaseMethod(self, args, CaseOp::kUpper, name);
  if (name == "capitalize") return CaseMethod(self, args, CaseOp::kCapitalize, name);
  if (name == "title") return CaseMethod(self, args, CaseOp::kTitleMethod, name);
  if (name == "replace") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"old", "new", "count"}, {Value::Int(-1)}));
    ASSIGN_OR_RETURN(std::string from, StrArg(name, a[0]));
    ASSIGN_OR_RETURN(std::string to, StrArg(name, a[1]));
    ASSIGN_OR_RETURN(int64_t count, IntArg(name, a[2]));
    std::string out = text::Replace(self.str(), from, to, count);
    RETURN_IF_ERROR(interp.ChargeString(out.size()));
    return Value::String(std::move(out));
  }
  if (name == "find") return Find(self, args, false, false, name);
  if (name == "rfind") return Find(self, args, true, false, name);
  if (name == "index") return Find(self, args, false, true, name);
  if (name == "rindex") return Find(self, args, true, true, name);
  if (name == "count") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sub"}, {}));
    ASSIGN_OR_RETURN(std::string sub, StrArg(name, a[0]));
    const std::string& s = self.str();
    if (sub.empty()) return Value::Int(static_cast<int64_t>(text::CodePointCount(s)) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
    return Value::Int(n);
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"iterable"}, {}));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(a[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
      }
      if (i > 0) out += self.str();
      out += items[i].str();
      RETURN_IF_ERROR(interp.ChargeString(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"affix"}, {}));
    ASSIGN_OR_RETURN(std::string affix, StrArg(name, a[0]));
    const std::string& s = self.str();
    if (name == "removeprefix" && s.starts_with(affix)) return Value::String(s.substr(affix.size()));
    if (name == "removesuffix" && !affix.empty() && s.ends_with(affix)) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
    return self;
  }
  if (name == "partition" || name == "rpartition") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"sep"}, {}));
    ASSIGN_OR_RETURN(std::string sep, StrArg(name, a[0]));
    if (sep.empty()) return absl::InvalidArgumentError("empty separator");
    const std::string& s = self.str();
    const bool right = name == "rpartition";
    const size_t pos = right ? s.rfind(sep) : s.find(sep);
    std::vector<Value> parts;
    if (pos == std::string::npos) {
      parts = right ? std::vector<Value>{Value::String(""), Value::String(""), self}
                    : std::vector<Value>{self, Value::String(""), Value::String("")};
    } else {
      parts = {Value::String(s.substr(0, pos)), Value::String(sep), Value::String(s.substr(pos + sep.size()))};
    }
    return Value::List(std::move(parts), SeqKind::kTuple);
  }
  if (name == "isspace") {
    RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
    const std::vector<char32_t> cps = text::Decode(self.str());
    if (cps.empty()) return Value::Bool(false);
    for (char32_t c : cps) {
      if (!text::IsSpace(c)) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return CharClass(self, args, name, [](char c) { return c >= '0' && c <= '9'; });
  }
  if (name == "isalpha") {
    return CharClass(self, args, name, [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); });
  }
  if (name == "isalnum") {
    return CharClass(self, args, name,
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); });
  }
  return absl::UnimplementedError(absl::StrCat("str.", AV(name), "() is not supported"));
}

absl::StatusOr<Value> DictMethod(const Value& self, std::string_view name, CallArgs& args) {
  const DictData& d = self.dict();
  if (name == "get") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"key", "default"}, {Value::None()}));
    if (a[0].is_string()) {
      if (const Value* v = d.Find(a[0].str())) return *v;
    } else if (a[0].kind() == Kind::kList && a[0].list().kind != SeqKind::kTuple) {
      return TypeError(absl::StrCat("unhashable type: '", TypeName(a[0]), "'"));
    }
    return a[1];
  }
  if (name == "items" || name == "keys" || name == "values") {
    RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
    std::vector<Value> out;
    for (const auto& [k, v] : d.items()) {
      if (name == "items") {
        out.push_back(Value::List({Value::String(k), v}, SeqKind::kTuple));
      } else {
        out.push_back(name == "keys" ? Value::String(k) : v);
      }
    }
    const SeqKind kind = name == "items"  ? SeqKind::kDictItems
                         : name == "keys" ? SeqKind::kDictKeys
                                          : SeqKind::kDictValues;
    return Value::List(std::move(out), kind);
  }
  if (name == "copy") {
    RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
    return self;
  }
  return absl::UnimplementedError(absl::StrCat("dict.", AV(name), "() is not supported"));
}

absl::StatusOr<Value> ListMethod(const Value& self, std::string_view name, CallArgs& args) {
  const auto& items = self.list().items;
  if (name == "index" || name == "count") {
    ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {"value"}, {}));
    int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!Equals(items[i], a[0])) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") return absl::InvalidArgumentError("value is not in list");
    return Value::Int(n);
  }
  return absl::UnimplementedError(absl::StrCat(TypeName(self), ".", AV(name), "() is not supported"));
}

bool Among(std::string_view name, std::initializer_list<std::string_view> names) {
  for (auto n : names) {
    if (n == name) return true;
  }
  return false;
}

Value Bound(const Value& self, std::string_view name) {
  std::string n(name);
  return Value::Callable(n, [self, n](Interpreter& interp, CallArgs& args) -> absl::StatusOr<Value> {
    switch (self.kind()) {
      case Kind::kString:
        return StrMethod(interp, self, n, args);
      case Kind::kDict:
        return DictMethod(self, n, args);
      default:
        return ListMethod(self, n, args);
    }
  });
}

Value Unsafe(const Value& self, std::string_view name) {
  return Value::Undefined(
      absl::StrCat("access to attribute '", AV(name), "' of '", TypeName(self), "' object is unsafe."));
}

absl::StatusOr<std::vector<std::pair<std::string, Value>>> DictArgs(std::string_view function, CallArgs& args) {
  std::vector<std::pair<std::string, Value>> out;
  if (args.positional.size() > 1) {
    return TypeError(absl::StrCat(AV(function), " expected at most 1 argument, got ", args.positional.size()));
  }
  if (args.positional.size() == 1) {
    const Value& src = args.positional[0];
    if (src.kind() == Kind::kDict) {
      for (const auto& kv : src.dict().items()) out.push_back(kv);
    } else {
      ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(src));
      for (const Value& p : pairs) {
        ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(p));
        if (kv.size() != 2) return TypeError("dictionary update sequence element has the wrong length");
        if (!kv[0].is_string()) {
          return absl::UnimplementedError(
              absl::StrCat("dict keys of type '", TypeName(kv[0]), "' are not supported (only str)"));
        }
        out.emplace_back(kv[0].str(), kv[1]);
      }
    }
  }
  for (auto& kv : args.keyword) out.push_back(kv);
  return out;
}

absl::StatusOr<Value> GlobalRange(Interpreter& interp, CallArgs& args) {
  if (!args.keyword.empty()) return TypeError("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", n));
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(v[i], IntArg("range", args.positional[i]));
  }
  int64_t start = 0, stop = v[0], step = 1;
  if (n >= 2) {
    start = v[0];
    stop = v[1];
  }
  if (n == 3) step = v[2];
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  __int128 count = 0;
  if (step > 0 && stop > start) count = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) count = (static_cast<__int128>(start) - stop - step - 1) / -step;
  if (count > 100000) {
    return absl::ResourceExhaustedError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  RETURN_IF_ERROR(interp.ChargeList(static_cast<size_t>(count)));
  std::vector<Value> items;
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::Int(static_cast<int64_t>(start + i * step)));
  std::string repr = step == 1 ? absl::StrCat("range(", start, ", ", stop, ")")
                               : absl::StrCat("range(", start, ", ", stop, ", ", step, ")");
  return Value::Range(std::move(items), std::move(repr));
}

absl::StatusOr<Value> GlobalNamespace(Interpreter& interp, CallArgs& args) {
  ASSIGN_OR_RETURN(auto pairs, DictArgs("namespace", args));
  auto d = std::make_shared<DictData>();
  for (auto& [k, v] : pairs) d->Set(k, v);
  if (d->depth() > kMaxValueDepth) {
    return absl::ResourceExhaustedError(absl::StrCat("values nest more than ", kMaxValueDepth, " deep"));
  }
  interp.Track(d);
  return Value::Namespace(std::move(d));
}

absl::StatusOr<Value> GlobalDict(Interpreter&, CallArgs& args) {
  ASSIGN_OR_RETURN(auto pairs, DictArgs("dict", args));
  auto d = std::make_shared<DictData>();
  for (auto& [k, v] : pairs) d->Set(k, v);
  if (d->depth() > kMaxValueDepth) {
    return absl::ResourceExhaustedError(absl::StrCat("values nest more than ", kMaxValueDepth, " deep"));
  }
  return Value::Dict(std::move(d));
}

absl::StatusOr<Value> GlobalRaise(Interpreter&, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("raise_exception", args, {"message"}, {}));
  ASSIGN_OR_RETURN(std::string message, ToStr(a[0]));
  return absl::InvalidArgumentError(absl::StrCat("raise_exception: ", message));
}

absl::StatusOr<Value> GlobalStrftimeNow(Interpreter& interp, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("strftime_now", args, {"format"}, {}));
  ASSIGN_OR_RETURN(std::string format, StrArg("strftime_now", a[0]));
  if (format.empty()) return Value::String("");
  const std::tm now = interp.Now();
  std::string buf(format.size() * 4 + 64, '\0');
  while (true) {
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &now);
    if (n > 0) {
      buf.resize(n);
      return Value::String(std::move(buf));
    }
    if (buf.size() > interp.limits().max_output_bytes) {
      return absl::InvalidArgumentError("strftime_now() produced no output or too much");
    }
    buf.resize(buf.size() * 4);
  }
}

absl::StatusOr<Value> NotSupportedGlobal(std::string_view name) {
  return absl::UnimplementedError(absl::StrCat("'", AV(name), "()' is not supported"));
}

DictData MakeGlobals() {
  DictData g;
  g.Set("range", Value::Callable("range", GlobalRange));
  g.Set("namespace", Value::Callable("namespace", GlobalNamespace));
  g.Set("dict", Value::Callable("dict", GlobalDict));
  g.Set("raise_exception", Value::Callable("raise_exception", GlobalRaise));
  g.Set("strftime_now", Value::Callable("strftime_now", GlobalStrftimeNow));
  for (const char* name : {"lipsum", "cycler", "joiner"}) {
    g.Set(name, Value::Callable(name, [name](Interpreter&, CallArgs&) { return NotSupportedGlobal(name); }));
  }
  return g;
}

}  // namespace

absl::StatusOr<std::vector<Value>> BindArgs(std::string_view function, CallArgs& args,
                                            std::initializer_list<std::string_view> names,
                                            std::vector<Value> defaults) {
  const size_t n = names.size();
  const size_t required = n - defaults.size();
  if (args.positional.size() > n) {
    return TypeError(
        absl::StrCat(AV(function), "() takes at most ", n, " argument(s) (", args.positional.size(), " given)"));
  }
  std::vector<Value> out(n);
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out[i] = args.positional[i];
    bound[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (auto it = names.begin(); it != names.end(); ++it, ++i) {
      if (*it == key) break;
    }
    if (i == n) return TypeError(absl::StrCat(AV(function), "() got an unexpected keyword argument '", key, "'"));
    if (bound[i]) return TypeError(absl::StrCat(AV(function), "() got multiple values for argument '", key, "'"));
    out[i] = value;
    bound[i] = true;
  }
  size_t i = 0;
  for (auto it = names.begin(); it != names.end(); ++it, ++i) {
    if (bound[i]) continue;
    if (i < required) return TypeError(absl::StrCat(AV(function), "() missing required argument '", AV(*it), "'"));
    out[i] = defaults[i - required];
  }
  return out;
}

Value GetMethod(const Value& self, std::string_view name, bool* found) {
  *found = true;
  switch (self.kind()) {
    case Kind::kString:
      if (Among(name,
                {"strip",        "lstrip",      "rstrip",     "split",      "rsplit",    "splitlines",   "startswith",
                 "endswith",     "lower",       "upper",      "capitalize", "title",     "replace",      "find",
                 "rfind",        "index",       "rindex",     "count",      "join",      "removeprefix", "removesuffix",
                 "partition",    "rpartition",  "isspace",    "isdigit",    "isdecimal", "isnumeric",    "isalpha",
                 "isalnum",      "format",      "format_map", "casefold",   "swapcase",  "center",       "ljust",
                 "rjust",        "zfill",       "expandtabs", "encode",     "islower",   "isupper",      "istitle",
                 "isidentifier", "isprintable", "isascii"})) {
        return Bound(self, name);
      }
      break;
    case Kind::kDict:
      if (Among(name, {"get", "items", "keys", "values", "copy", "fromkeys"})) return Bound(self, name);
      if (Among(name, {"clear", "pop", "popitem", "setdefault", "update"})) return Unsafe(self, name);
      break;
    case Kind::kList:
      if (self.list().kind == SeqKind::kList || self.list().kind == SeqKind::kTuple ||
          self.list().kind == SeqKind::kRange) {
        if (Among(name, {"index", "count"})) return Bound(self, name);
        if (self.list().kind == SeqKind::kList) {
          if (Among(name, {"append", "reverse", "insert", "sort", "extend", "remove"})) return Unsafe(self, name);
          if (Among(name, {"pop", "clear", "copy"})) return Bound(self, name);
        }
      }
      break;
    default:
      break;
  }
  *found = false;
  return Value();
}

const DictData& Globals() {
  static const DictData* globals = new DictData(MakeGlobals());
  return *globals;
}

}  // namespace tandem::chat_template
