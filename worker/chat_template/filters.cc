// jinja2's filters (the ones chat templates use) with transformers' tojson;
// the tests (`x is defined`) are in tests.cc, as in jinja2's own modules.
// One file on purpose: the name -> function table and the filters it names,
// sharing the attribute getter, number parsing and lazy generators.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/evaluator.h"
#include "worker/chat_template/text.h"

namespace tandem::chat_template {
namespace {

absl::Status TypeError(std::string m) { return absl::InvalidArgumentError(std::move(m)); }

absl::StatusOr<std::string> SoftStr(const Value& v) { return ToStr(v); }

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0, with
// the environment's getitem.
struct AttrGetter {
  std::vector<Value> parts;
  std::optional<Value> default_value;
  bool ignore_case = false;

  static absl::StatusOr<AttrGetter> Make(const Value& attribute) {
    AttrGetter g;
    if (attribute.is_none()) return g;
    if (attribute.is_string()) {
      for (const std::string& part : text::Split(attribute.str(), &kDot, -1, false)) {
        bool digits = !part.empty();
        for (char c : part) digits = digits && c >= '0' && c <= '9';
        if (digits && part.size() < 18) {
          g.parts.push_back(Value::Int(std::stoll(part)));
        } else {
          g.parts.push_back(Value::String(part));
        }
      }
      return g;
    }
    g.parts.push_back(attribute);
    return g;
  }

  absl::StatusOr<Value> Get(Interpreter& interp, Value item) const {
    for (const Value& part : parts) {
      ASSIGN_OR_RETURN(item, interp.GetItem(item, part));
      if (default_value && !default_value->is_none() && item.is_undefined()) item = *default_value;
    }
    if (ignore_case && item.is_string()) {
      ASSIGN_OR_RETURN(std::string lower, text::ChangeCase(item.str(), text::CaseOp::kLower));
      item = Value::String(std::move(lower));
    }
    return item;
  }

  static const std::string kDot;
};
const std::string AttrGetter::kDot = ".";

// Python's float(str): strips whitespace; digits with single underscores
// between them; inf / nan spellings.
std::optional<double> ParsePyFloat(std::string_view s) {
  std::string t = text::Strip(s, text::StripSide::kBoth, nullptr);
  if (t.empty() || !text::IsAscii(t)) return std::nullopt;
  std::string lower;
  for (char c : t) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string_view body = lower;
  std::string sign;
  if (body[0] == '+' || body[0] == '-') {
    sign = std::string(1, body[0]);
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return sign == "-" ? -HUGE_VAL : HUGE_VAL;
  if (body == "nan") return std::nan("");
  std::string clean;
  bool seen_digit = false, seen_dot = false, seen_exp = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c >= '0' && c <= '9') {
      clean.push_back(c);
      seen_digit = true;
    } else if (c == '_') {
      if (i == 0 || i + 1 >= body.size() || !std::isdigit(static_cast<unsigned char>(body[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(body[i + 1]))) {
        return std::nullopt;
      }
    } else if (c == '.' && !seen_dot && !seen_exp) {
      clean.push_back(c);
      seen_dot = true;
    } else if (c == 'e' && seen_digit && !seen_exp) {
      clean.push_back(c);
      seen_exp = true;
      seen_digit = false;
      if (i + 1 < body.size() && (body[i + 1] == '+' || body[i + 1] == '-')) clean.push_back(body[++i]);
    } else {
      return std::nullopt;
    }
  }
  if (!seen_digit) return std::nullopt;
  return std::strtod((sign + clean).c_str(), nullptr);
}

// Python's int(str, base) for base 0 or 2..36 (the common spellings).
std::optional<int64_t> ParsePyInt(std::string_view s, int64_t base, bool* overflow) {
  std::string t = text::Strip(s, text::StripSide::kBoth, nullptr);
  if (!text::IsAscii(t)) return std::nullopt;
  std::string_view b = t;
  bool negative = false;
  if (!b.empty() && (b[0] == '+' || b[0] == '-')) {
    negative = b[0] == '-';
    b.remove_prefix(1);
  }
  auto prefix_base = [&](std::string_view v) -> int64_t {
    if (v.size() >= 2 && v[0] == '0') {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(v[1])));
      if (p == 'x') return 16;
      if (p == 'o') return 8;
      if (p == 'b') return 2;
    }
    return 0;
  };
  const int64_t pb = prefix_base(b);
  bool had_prefix = false;
  if (base == 0) {
    base = pb != 0 ? pb : 10;
    had_prefix = pb != 0;
    if (!had_prefix && b.size() > 1 && b[0] == '0') {
      for (char c : b) {
        if (c != '0' && c != '_') return std::nullopt;
      }
    }
  } else if (pb != 0 && pb == base) {
    had_prefix = true;
  }
  if (base < 2 || base > 36) return std::nullopt;
  if (had_prefix) b.remove_prefix(2);
  if (b.empty()) return std::nullopt;
  unsigned __int128 v = 0;
  bool prev_digit = had_prefix;  // an underscore may follow the prefix
  bool any = false;
  for (size_t i = 0; i < b.size(); ++i) {
    const char c = b[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= b.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (v > static_cast<unsigned __int128>(INT64_MAX) + 1) {
      *overflow = true;
      return std::nullopt;
    }
    prev_digit = true;
    any = true;
  }
  if (!any) return std::nullopt;
  if (!negative && v > static_cast<unsigned __int128>(INT64_MAX)) {
    *overflow = true;
    return std::nullopt;
  }
  return negative ? static_cast<int64_t>(-static_cast<__int128>(v)) : static_cast<int64_t>(v);
}

absl::StatusOr<std::optional<int64_t>> FloatToInt(double d) {
  if (std::isnan(d)) return std::optional<int64_t>();
  if (std::isinf(d)) return absl::InvalidArgumentError("cannot convert float infinity to integer");
  const double t = std::trunc(d);
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) {
    return absl::UnimplementedError("integers beyond 64 bits are not supported");
  }
  return std::optional<int64_t>(static_cast<int64_t>(t));
}

// jinja2's select / map / unique / items filters are generators: their
// errors surface only when the result is iterated. `compute` fills the
// items; an error it returns (other than a limit) is kept in the iterator.
template <typename F>
absl::StatusOr<Value> LazyGenerator(F compute) {
  std::vector<Value> items;
  absl::Status s = compute(&items);
  if (s.code() == absl::StatusCode::kResourceExhausted) return s;
  Value it = Value::Iterator("generator", std::move(items));
  it.iter().error = s;
  return it;
}

// ---- filters ----

absl::StatusOr<Value> FAbs(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("abs", args, {}, {}).status());
  if (in.is_integer_like()) {
    if (in.as_int() == INT64_MIN) return absl::UnimplementedError("integers beyond 64 bits are not supported");
    return Value::Int(std::llabs(in.as_int()));
  }
  if (in.kind() == Kind::kFloat) return Value::Float(std::fabs(in.as_double()));
  return TypeError(absl::StrCat("bad operand type for abs(): '", TypeName(in), "'"));
}

absl::StatusOr<Value> CaseFilter(const Value& in, CallArgs& args, text::CaseOp op, std::string_view name) {
  RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
  ASSIGN_OR_RETURN(std::string s, SoftStr(in));
  ASSIGN_OR_RETURN(s, text::ChangeCase(s, op));
  return Value::String(std::move(s));
}

absl::StatusOr<Value> FCapitalize(Interpreter&, const Value& in, CallArgs& args) {
  return CaseFilter(in, args, text::CaseOp::kCapitalize, "capitalize");
}
absl::StatusOr<Value> FLower(Interpreter&, const Value& in, CallArgs& args) {
  return CaseFilter(in, args, text::CaseOp::kLower, "lower");
}
absl::StatusOr<Value> FUpper(Interpreter&, const Value& in, CallArgs& args) {
  return CaseFilter(in, args, text::CaseOp::kUpper, "upper");
}
absl::StatusOr<Value> FTitle(Interpreter&, const Value& in, CallArgs& args) {
  return CaseFilter(in, args, text::CaseOp::kTitleFilter, "title");
}

absl::StatusOr<Value> FLength(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("length", args, {}, {}).status());
  ASSIGN_OR_RETURN(int64_t n, Length(in));
  return Value::Int(n);
}

absl::StatusOr<Value> FDefault(Interpreter&, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a,
                   BindArgs("default", args, {"default_value", "boolean"}, {Value::String(""), Value::Bool(false)}));
  if (in.is_undefined() || (Truthy(a[1]) && !Truthy(in))) return a[0];
  return in;
}

absl::StatusOr<Value> FFirst(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("first", args, {}, {}).status());
  if (in.kind() == Kind::kIterator) {
    IteratorData& it = in.iter();
    if (it.pos < it.items.size()) return it.items[it.pos++];
    if (!it.error.ok()) return it.error;
    return Value::Undefined("No first item, sequence was empty.");
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FLast(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("last", args, {}, {}).status());
  if (in.kind() == Kind::kIterator) {
    return TypeError(absl::StrCat("'", TypeName(in), "' object is not reversible"));
  }
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

absl::StatusOr<Value> FFloat(Interpreter&, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("float", args, {"default"}, {Value::Float(0.0)}));
  if (in.is_undefined()) return absl::InvalidArgumentError(in.undefined_message());
  if (in.is_number()) return Value::Float(in.as_double());
  if (in.is_string()) {
    if (auto d = ParsePyFloat(in.str())) return Value::Float(*d);
  }
  return a[0];
}

absl::StatusOr<Value> FInt(Interpreter&, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("int", args, {"default", "base"}, {Value::Int(0), Value::Int(10)}));
  if (in.is_undefined()) return absl::InvalidArgumentError(in.undefined_message());
  if (in.is_integer_like()) return Value::Int(in.as_int());
  if (in.kind() == Kind::kFloat) {
    ASSIGN_OR_RETURN(auto i, FloatToInt(in.as_double()));
    return i ? Value::Int(*i) : a[0];
  }
  if (in.is_string()) {
    if (!a[1].is_integer_like()) return TypeError("int() base must be an integer");
    bool overflow = false;
    if (auto i = ParsePyInt(in.str(), a[1].as_int(), &overflow)) return Value::Int(*i);
    if (overflow) return absl::UnimplementedError("integers beyond 64 bits are not supported");
    if (auto d = ParsePyFloat(in.str())) {
      ASSIGN_OR_RETURN(auto i, FloatToInt(*d));
      if (i) return Value::Int(*i);
    }
  }
  return a[0];
}

absl::StatusOr<Value> FIndent(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("indent", args, {"width", "first", "blank"},
                                    {Value::Int(4), Value::Bool(false), Value::Bool(false)}));
  if (in.is_undefined()) return absl::InvalidArgumentError(in.undefined_message());
  if (!in.is_string())
    return TypeError(absl::StrCat("unsupported operand type(s) for +=: '", TypeName(in), "' and 'str'"));
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].str();
  } else if (a[0].is_integer_like()) {
    indention.assign(static_cast<size_t>(std::clamp<int64_t>(a[0].as_int(), 0, 4096)), ' ');
  } else {
    return TypeError(absl::StrCat("can't multiply sequence by non-int of type '", TypeName(a[0]), "'"));
  }
  std::vector<std::string> lines = text::SplitLines(in.str() + "\n", false);
  std::string rv;
  if (Truthy(a[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (Truthy(a[1])) rv = indention + rv;
  RETURN_IF_ERROR(interp.ChargeString(rv.size()));
  return Value::String(std::move(rv));
}

absl::StatusOr<Value> FItems(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("items", args, {}, {}).status());
  return LazyGenerator([&](std::vector<Value>* out) -> absl::Status {
    if (in.is_undefined()) return absl::OkStatus();
    if (in.kind() != Kind::kDict) return TypeError("Can only get item pairs from a mapping.");
    for (const auto& [k, v] : in.dict().items()) out->push_back(Value::List({Value::String(k), v}, SeqKind::kTuple));
    return absl::OkStatus();
  });
}

absl::StatusOr<Value> FJoin(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("join", args, {"d", "attribute"}, {Value::String(""), Value::None()}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  ASSIGN_OR_RETURN(std::string sep, SoftStr(a[0]));
  std::optional<AttrGetter> getter;
  if (!a[1].is_none()) {
    ASSIGN_OR_RETURN(getter, AttrGetter::Make(a[1]));
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (getter) {
      ASSIGN_OR_RETURN(item, getter->Get(interp, item));
    }
    ASSIGN_OR_RETURN(std::string s, SoftStr(item));
    if (i > 0) out += sep;
    out += s;
    RETURN_IF_ERROR(interp.ChargeString(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FList(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("list", args, {}, {}).status());
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FString(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("string", args, {}, {}).status());
  ASSIGN_OR_RETURN(std::string s, SoftStr(in));
  return Value::String(std::move(s));
}

absl::StatusOr<Value> FTrim(Interpreter&, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("trim", args, {"chars"}, {Value::None()}));
  ASSIGN_OR_RETURN(std::string s, SoftStr(in));
  if (!a[0].is_none() && !a[0].is_string()) return TypeError("strip arg must be None or str");
  return Value::String(text::Strip(s, text::StripSide::kBoth, a[0].is_none() ? nullptr : &a[0].str()));
}

absl::StatusOr<Value> FReplace(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("replace", args, {"old", "new", "count"}, {Value::None()}));
  ASSIGN_OR_RETURN(std::string s, SoftStr(in));
  ASSIGN_OR_RETURN(std::string from, SoftStr(a[0]));
  ASSIGN_OR_RETURN(std::string to, SoftStr(a[1]));
  int64_t count = -1;
  if (!a[2].is_none()) {
    if (!a[2].is_integer_like()) return TypeError("'count' must be an integer");
    count = a[2].as_int();
  }
  std::string out = text::Replace(s, from, to, count);
  RETURN_IF_ERROR(interp.ChargeString(out.size()));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FReverse(Interpreter&, const Value& in, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs("reverse", args, {}, {}).status());
  if (in.is_string()) {
    std::vector<char32_t> cps = text::Decode(in.str());
    std::reverse(cps.begin(), cps.end());
    return Value::String(text::Encode(cps, 0, cps.size()));
  }
  if (in.kind() == Kind::kIterator) {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (in.is_undefined() || in.kind() == Kind::kList || in.kind() == Kind::kDict) {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
    std::reverse(items.begin(), items.end());
    return Value::Iterator("reversed", std::move(items));
  }
  return absl::InvalidArgumentError("argument must be iterable");
}

absl::StatusOr<Value> FRound(Interpreter&, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("round", args, {"precision", "method"}, {Value::Int(0), Value::String("common")}));
  if (!a[1].is_string() || (a[1].str() != "common" && a[1].str() != "ceil" && a[1].str() != "floor")) {
    return absl::InvalidArgumentError("method must be common, ceil or floor");
  }
  if (in.is_undefined()) return absl::InvalidArgumentError(in.undefined_message());
  if (!in.is_number()) return TypeError(absl::StrCat("type ", TypeName(in), " doesn't define __round__ method"));
  if (!a[0].is_integer_like()) {
    return TypeError(absl::StrCat("'", TypeName(a[0]), "' object cannot be interpreted as an integer"));
  }
  const int64_t precision = a[0].as_int();
  if (precision < 0) return absl::UnimplementedError("round() with a negative precision is not supported");
  const std::string& method = a[1].str();
  if (method == "common") {
    if (in.is_integer_like()) return Value::Int(in.as_int());
    const double x = in.as_double();
    if (!std::isfinite(x)) return Value::Float(x);
    if (precision == 0) return Value::Float(std::nearbyint(x));
    if (precision > 330) return Value::Float(x);
    std::vector<char> buf(400 + static_cast<size_t>(precision));
    std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(precision), x);
    return Value::Float(std::strtod(buf.data(), nullptr));
  }
  if (precision > 22) return absl::UnimplementedError("round() with ceil/floor beyond 22 digits is not supported");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = in.as_double() * scale;
  if (!std::isfinite(scaled)) return absl::InvalidArgumentError("cannot convert float infinity to integer");
  const double r = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::Float(r / scale);
}

absl::StatusOr<Value> FToJson(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"},
                                    {Value::Bool(false), Value::None(), Value::None(), Value::Bool(false)}));
  JsonOptions o;
  o.ensure_ascii = Truthy(a[0]);
  if (a[1].is_string()) {
    o.indent = a[1].str();
  } else if (a[1].is_integer_like()) {
    o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(a[1].as_int(), 0, 4096)), ' ');
  } else if (!a[1].is_none()) {
    return TypeError(absl::StrCat("can't multiply sequence by non-int of type '", TypeName(a[1]), "'"));
  }
  if (!a[2].is_none()) {
    ASSIGN_OR_RETURN(std::vector<Value> seps, Iterate(a[2]));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      return TypeError("separators must be a pair of strings");
    }
    o.separators.emplace(seps[0].str(), seps[1].str());
  }
  o.sort_keys = Truthy(a[3]);
  ASSIGN_OR_RETURN(std::string out, ToJson(in, o));
  RETURN_IF_ERROR(interp.ChargeString(out.size()));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FMap(Interpreter& interp, const Value& in, CallArgs& args) {
  return LazyGenerator([&](std::vector<Value>* out) -> absl::Status {
    if (!Truthy(in)) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
    if (args.positional.empty()) {
      std::optional<Value> attribute, default_value;
      for (auto& [k, v] : args.keyword) {
        if (k == "attribute") {
          attribute = v;
        } else if (k == "default") {
          default_value = v;
        } else {
          return TypeError(absl::StrCat("Unexpected keyword argument '", k, "'"));
        }
      }
      if (!attribute) return absl::InvalidArgumentError("map requires a filter argument");
      ASSIGN_OR_RETURN(AttrGetter getter, AttrGetter::Make(*attribute));
      getter.default_value = default_value;
      for (const Value& item : items) {
        ASSIGN_OR_RETURN(Value v, getter.Get(interp, item));
        out->push_back(std::move(v));
      }
      return absl::OkStatus();
    }
    if (!args.positional[0].is_string()) return TypeError("map() needs a filter name");
    const std::string name = args.positional[0].str();
    for (const Value& item : items) {
      CallArgs sub;
      sub.line = args.line;
      sub.positional.assign(args.positional.begin() + 1, args.positional.end());
      sub.keyword = args.keyword;
      ASSIGN_OR_RETURN(Value v, interp.CallFilter(name, item, sub));
      out->push_back(std::move(v));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Value> SelectOrReject(Interpreter& interp, const Value& in, CallArgs& args, bool select,
                                     bool lookup_attr) {
  return LazyGenerator([&](std::vector<Value>* out) -> absl::Status {
    if (!Truthy(in)) return absl::OkStatus();
    std::optional<AttrGetter> getter;
    size_t off = 0;
    if (lookup_attr) {
      if (args.positional.empty()) return absl::InvalidArgumentError("Missing parameter for attribute name");
      ASSIGN_OR_RETURN(getter, AttrGetter::Make(args.positional[0]));
      off = 1;
    }
    std::optional<std::string> test;
    if (args.positional.size() > off) {
      if (!args.positional[off].is_string()) return TypeError("the test name must be a string");
      test = args.positional[off].str();
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
    for (const Value& item : items) {
      Value v = item;
      if (getter) {
        ASSIGN_OR_RETURN(v, getter->Get(interp, item));
      }
      bool ok;
      if (test) {
        CallArgs sub;
        sub.line = args.line;
        sub.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(off) + 1, args.positional.end());
        sub.keyword = args.keyword;
        ASSIGN_OR_RETURN(ok, interp.CallTest(*test, v, sub));
      } else {
        ok = Truthy(v);
      }
      if (ok == select) out->push_back(item);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Value> FSelect(Interpreter& i, const Value& in, CallArgs& a) {
  return SelectOrReject(i, in, a, true, false);
}
absl::StatusOr<Value> FReject(Interpreter& i, const Value& in, CallArgs& a) {
  return SelectOrReject(i, in, a, false, false);
}
absl::StatusOr<Value> FSelectAttr(Interpreter& i, const Value& in, CallArgs& a) {
  return SelectOrReject(i, in, a, true, true);
}
absl::StatusOr<Value> FRejectAttr(Interpreter& i, const Value& in, CallArgs& a) {
  return SelectOrReject(i, in, a, false, true);
}

// Stable sort with Python's ordering; the first comparison error wins.
absl::Status SortBy(std::vector<std::pair<std::vector<Value>, Value>>* keyed, bool reverse) {
  absl::Status error;
  auto less = [&](const std::vector<Value>& x, const std::vector<Value>& y) {
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      absl::StatusOr<int> c = Compare(x[i], y[i], "<");
      if (!c.ok()) {
        if (error.ok()) error = c.status();
        return false;
      }
      return *c == -1;
    }
    return x.size() < y.size();
  };
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto& a, const auto& b) {
    return reverse ? less(b.first, a.first) : less(a.first, b.first);
  });
  return error;
}

absl::StatusOr<Value> FSort(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"},
                                    {Value::Bool(false), Value::Bool(false), Value::None()}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  std::vector<AttrGetter> getters;
  if (a[2].is_string()) {
    static const std::string kComma = ",";
    for (const std::string& part : text::Split(a[2].str(), &kComma, -1, false)) {
      ASSIGN_OR_RETURN(AttrGetter g, AttrGetter::Make(Value::String(part)));
      getters.push_back(std::move(g));
    }
  } else {
    ASSIGN_OR_RETURN(AttrGetter g, AttrGetter::Make(a[2]));
    getters.push_back(std::move(g));
  }
  std::vector<std::pair<std::vector<Value>, Value>> keyed;
  for (const Value& item : items) {
    std::vector<Value> key;
    for (AttrGetter& g : getters) {
      g.ignore_case = !Truthy(a[1]);
      ASSIGN_OR_RETURN(Value k, g.Get(interp, item));
      key.push_back(std::move(k));
    }
    keyed.emplace_back(std::move(key), item);
  }
  RETURN_IF_ERROR(interp.ChargeList(keyed.size() * 8));
  RETURN_IF_ERROR(SortBy(&keyed, Truthy(a[0])));
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FDictSort(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("dictsort", args, {"case_sensitive", "by", "reverse"},
                                    {Value::Bool(false), Value::String("key"), Value::Bool(false)}));
  if (in.kind() != Kind::kDict) return TypeError(absl::StrCat("'", TypeName(in), "' object has no attribute 'items'"));
  int pos;
  if (a[1].is_string() && a[1].str() == "key") {
    pos = 0;
  } else if (a[1].is_string() && a[1].str() == "value") {
    pos = 1;
  } else {
    return absl::InvalidArgumentError("You can only sort by either \"key\" or \"value\"");
  }
  std::vector<std::pair<std::vector<Value>, Value>> keyed;
  for (const auto& [k, v] : in.dict().items()) {
    Value key = pos == 0 ? Value::String(k) : v;
    if (!Truthy(a[0]) && key.is_string()) {
      ASSIGN_OR_RETURN(std::string lower, text::ChangeCase(key.str(), text::CaseOp::kLower));
      key = Value::String(std::move(lower));
    }
    keyed.emplace_back(std::vector<Value>{key}, Value::List({Value::String(k), v}, SeqKind::kTuple));
  }
  RETURN_IF_ERROR(interp.ChargeList(keyed.size() * 8));
  RETURN_IF_ERROR(SortBy(&keyed, Truthy(a[2])));
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FUnique(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a,
                   BindArgs("unique", args, {"case_sensitive", "attribute"}, {Value::Bool(false), Value::None()}));
  return LazyGenerator([&](std::vector<Value>* out) -> absl::Status {
    ASSIGN_OR_RETURN(AttrGetter getter, AttrGetter::Make(a[1]));
    getter.ignore_case = !Truthy(a[0]);
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
    std::vector<Value> seen;
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value key, getter.Get(interp, item));
      if (key.kind() == Kind::kDict || key.kind() == Kind::kNamespace ||
          (key.kind() == Kind::kList && key.list().kind == SeqKind::kList)) {
        return TypeError(absl::StrCat("unhashable type: '", TypeName(key), "'"));
      }
      RETURN_IF_ERROR(interp.ChargeList(seen.size()));
      bool dup = false;
      for (const Value& s : seen) dup = dup || Equals(s, key);
      if (dup) continue;
      seen.push_back(key);
      out->push_back(item);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Value> MinMax(Interpreter& interp, const Value& in, CallArgs& args, bool max) {
  ASSIGN_OR_RETURN(auto a, BindArgs(max ? "max" : "min", args, {"case_sensitive", "attribute"},
                                    {Value::Bool(false), Value::None()}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  ASSIGN_OR_RETURN(AttrGetter getter, AttrGetter::Make(a[1]));
  getter.ignore_case = !Truthy(a[0]);
  size_t best = 0;
  ASSIGN_OR_RETURN(Value best_key, getter.Get(interp, items[0]));
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value key, getter.Get(interp, items[i]));
    ASSIGN_OR_RETURN(int c, Compare(key, best_key, max ? ">" : "<"));
    if ((max && c == 1) || (!max && c == -1)) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

absl::StatusOr<Value> FMax(Interpreter& i, const Value& in, CallArgs& a) { return MinMax(i, in, a, true); }
absl::StatusOr<Value> FMin(Interpreter& i, const Value& in, CallArgs& a) { return MinMax(i, in, a, false); }

absl::StatusOr<Value> Add(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError((a.is_undefined() ? a : b).undefined_message());
  }
  if (a.is_integer_like() && b.is_integer_like()) {
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) {
      return absl::UnimplementedError("integers beyond 64 bits are not supported");
    }
    return Value::Int(r);
  }
  if (a.is_number() && b.is_number()) return Value::Float(a.as_double() + b.as_double());
  if (a.kind() == Kind::kList && b.kind() == Kind::kList && a.list().kind == SeqKind::kList &&
      b.list().kind == SeqKind::kList) {
    std::vector<Value> items = a.list().items;
    items.insert(items.end(), b.list().items.begin(), b.list().items.end());
    return Value::List(std::move(items));
  }
  return TypeError(absl::StrCat("unsupported operand type(s) for +: '", TypeName(a), "' and '", TypeName(b), "'"));
}

absl::StatusOr<Value> FSum(Interpreter& interp, const Value& in, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("sum", args, {"attribute", "start"}, {Value::None(), Value::Int(0)}));
  if (a[1].is_string()) return TypeError("sum() can't sum strings [use ''.join(seq) instead]");
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(in));
  ASSIGN_OR_RETURN(AttrGetter getter, AttrGetter::Make(a[0]));
  Value total = a[1];
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, getter.Get(interp, item));
    ASSIGN_OR_RETURN(total, Add(total, v));
    if (total.kind() == Kind::kList) RETURN_IF_ERROR(interp.ChargeList(total.list().items.size()));
  }
  return total;
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};
constexpr FilterEntry kFilters[] = {
    {"abs", FAbs},
    {"capitalize", FCapitalize},
    {"count", FLength},
    {"d", FDefault},
    {"default", FDefault},
    {"dictsort", FDictSort},
    {"first", FFirst},
    {"float", FFloat},
    {"indent", FIndent},
    {"int", FInt},
    {"items", FItems},
    {"join", FJoin},
    {"last", FLast},
    {"length", FLength},
    {"list", FList},
    {"lower", FLower},
    {"map", FMap},
    {"max", FMax},
    {"min", FMin},
    {"reject", FReject},
    {"rejectattr", FRejectAttr},
    {"replace", FReplace},
    {"reverse", FReverse},
    {"round", FRound},
    {"select", FSelect},
    {"selectattr", FSelectAttr},
    {"sort", FSort},
    {"string", FString},
    {"sum", FSum},
    {"title", FTitle},
    {"tojson", FToJson},
    {"trim", FTrim},
    {"unique", FUnique},
    {"upper", FUpper},
};

constexpr std::string_view kJinjaOnlyFilters[] = {"attr",           "batch",       "center",    "e",         "escape",
                                                  "filesizeformat", "forceescape", "format",    "groupby",   "pprint",
                                                  "random",         "safe",        "slice",     "striptags", "truncate",
                                                  "urlencode",      "urlize",      "wordcount", "wordwrap",  "xmlattr"};

}  // namespace

FilterFn FindFilter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

bool IsJinjaFilter(std::string_view name) {
  if (FindFilter(name) != nullptr) return true;
  for (auto n : kJinjaOnlyFilters) {
    if (n == name) return true;
  }
  return false;
}

}  // namespace tandem::chat_template
