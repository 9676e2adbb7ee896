// jinja2's tests (`x is defined`, `x is divisibleby 3`, ...) that chat
// templates use, and their name table (builtins.h).
#include <cmath>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/evaluator.h"

namespace tandem::chat_template {
namespace {

absl::Status TypeError(std::string m) { return absl::InvalidArgumentError(std::move(m)); }

absl::StatusOr<bool> NoArgs(std::string_view name, CallArgs& args) {
  RETURN_IF_ERROR(BindArgs(name, args, {}, {}).status());
  return true;
}

#define CT_SIMPLE_TEST(fn, name, expr)                                    \
  absl::StatusOr<bool> fn(Interpreter&, const Value& v, CallArgs& args) { \
    RETURN_IF_ERROR(NoArgs(name, args).status());                         \
    return (expr);                                                        \
  }

CT_SIMPLE_TEST(TDefined, "defined", !v.is_undefined())
CT_SIMPLE_TEST(TUndefined, "undefined", v.is_undefined())
CT_SIMPLE_TEST(TNone, "none", v.is_none())
CT_SIMPLE_TEST(TBoolean, "boolean", v.kind() == Kind::kBool)
CT_SIMPLE_TEST(TTrue, "true", v.kind() == Kind::kBool && v.as_bool())
CT_SIMPLE_TEST(TFalse, "false", v.kind() == Kind::kBool && !v.as_bool())
CT_SIMPLE_TEST(TInteger, "integer", v.kind() == Kind::kInt)
CT_SIMPLE_TEST(TFloat, "float", v.kind() == Kind::kFloat)
CT_SIMPLE_TEST(TNumber, "number", v.is_number())
CT_SIMPLE_TEST(TString, "string", v.is_string())
CT_SIMPLE_TEST(TMapping, "mapping", v.kind() == Kind::kDict)
CT_SIMPLE_TEST(TCallable, "callable",
               v.kind() == Kind::kCallable || v.kind() == Kind::kUndefined || v.kind() == Kind::kObject)
CT_SIMPLE_TEST(TIterable, "iterable",
               v.kind() == Kind::kUndefined || v.is_string() || v.kind() == Kind::kList || v.kind() == Kind::kDict ||
                   v.kind() == Kind::kIterator || v.kind() == Kind::kObject)
CT_SIMPLE_TEST(TSequence, "sequence",
               v.kind() == Kind::kUndefined || v.is_string() || v.kind() == Kind::kDict ||
                   (v.kind() == Kind::kList && (v.list().kind == SeqKind::kList || v.list().kind == SeqKind::kTuple ||
                                                v.list().kind == SeqKind::kRange)))

#undef CT_SIMPLE_TEST

// value % 2 == want (Python modulo), as jinja2's odd / even tests.
absl::StatusOr<bool> Parity(const Value& v, CallArgs& args, std::string_view name, int64_t want) {
  RETURN_IF_ERROR(NoArgs(name, args).status());
  if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
  if (v.is_integer_like()) {
    int64_t r = v.as_int() % 2;
    if (r < 0) r += 2;
    return r == want;
  }
  if (v.kind() == Kind::kFloat) {
    const double m = std::fmod(v.as_double(), 2.0);
    const double r = m < 0 ? m + 2.0 : m;
    return r == static_cast<double>(want);
  }
  if (v.is_string()) return absl::UnimplementedError("string formatting with % is not supported");
  return TypeError(absl::StrCat("unsupported operand type(s) for %: '", TypeName(v), "' and 'int'"));
}

absl::StatusOr<bool> TOdd(Interpreter&, const Value& v, CallArgs& a) { return Parity(v, a, "odd", 1); }
absl::StatusOr<bool> TEven(Interpreter&, const Value& v, CallArgs& a) { return Parity(v, a, "even", 0); }

absl::StatusOr<bool> TDivisibleBy(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("divisibleby", args, {"num"}, {}));
  if (v.is_undefined()) return absl::InvalidArgumentError(v.undefined_message());
  if (!v.is_number() || !a[0].is_number()) {
    return TypeError(absl::StrCat("unsupported operand type(s) for %: '", TypeName(v), "' and '", TypeName(a[0]), "'"));
  }
  if (a[0].as_double() == 0) return TypeError("integer division or modulo by zero");
  if (v.is_integer_like() && a[0].is_integer_like()) {
    if (a[0].as_int() == -1) return true;
    return v.as_int() % a[0].as_int() == 0;
  }
  return std::fmod(v.as_double(), a[0].as_double()) == 0;
}

absl::StatusOr<bool> CompareTest(const Value& v, CallArgs& args, std::string_view op) {
  ASSIGN_OR_RETURN(auto a, BindArgs(op, args, {"other"}, {}));
  if (op == "==") return Equals(v, a[0]);
  if (op == "!=") return !Equals(v, a[0]);
  ASSIGN_OR_RETURN(int c, Compare(v, a[0], op));
  if (c == 2) return false;
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

absl::StatusOr<bool> TEq(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, "=="); }
absl::StatusOr<bool> TNe(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, "!="); }
absl::StatusOr<bool> TLt(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, "<"); }
absl::StatusOr<bool> TLe(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, "<="); }
absl::StatusOr<bool> TGt(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, ">"); }
absl::StatusOr<bool> TGe(Interpreter&, const Value& v, CallArgs& a) { return CompareTest(v, a, ">="); }

absl::StatusOr<bool> TIn(Interpreter&, const Value& v, CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, BindArgs("in", args, {"seq"}, {}));
  return Contains(a[0], v);
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"boolean", TBoolean},
    {"callable", TCallable},
    {"defined", TDefined},
    {"divisibleby", TDivisibleBy},
    {"eq", TEq},
    {"equalto", TEq},
    {"==", TEq},
    {"ne", TNe},
    {"!=", TNe},
    {"even", TEven},
    {"false", TFalse},
    {"float", TFloat},
    {"ge", TGe},
    {">=", TGe},
    {"gt", TGt},
    {">", TGt},
    {"greaterthan", TGt},
    {"in", TIn},
    {"integer", TInteger},
    {"iterable", TIterable},
    {"le", TLe},
    {"<=", TLe},
    {"lt", TLt},
    {"<", TLt},
    {"lessthan", TLt},
    {"mapping", TMapping},
    {"none", TNone},
    {"number", TNumber},
    {"odd", TOdd},
    {"sequence", TSequence},
    {"string", TString},
    {"true", TTrue},
    {"undefined", TUndefined},
};

constexpr std::string_view kJinjaOnlyTests[] = {"escaped", "filter", "test", "lower", "upper", "sameas"};

}  // namespace

TestFn FindTest(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

bool IsJinjaTest(std::string_view name) {
  if (FindTest(name) != nullptr) return true;
  for (auto n : kJinjaOnlyTests) {
    if (n == name) return true;
  }
  return false;
}

}  // namespace tandem::chat_template
