// One file on purpose: the interpreter is one mutually recursive walk over
// the AST (statements, expressions, calls, loops and macros; see evaluator.h).
#include "worker/chat_template/evaluator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/builtins.h"
#include "worker/chat_template/lexer.h"
#include "worker/chat_template/text.h"

namespace tandem::chat_template {
namespace {

constexpr std::string_view kLinePrefix = "chat template line ";

absl::Status TypeError(std::string message) { return absl::InvalidArgumentError(std::move(message)); }

absl::Status UndefinedError(const Value& v) { return absl::InvalidArgumentError(v.undefined_message()); }

absl::Status IntegerOverflow() {
  return absl::UnimplementedError("integer overflow: results beyond 64 bits (Python's big integers) are not supported");
}

// jinja2's object_type_repr: "dict object", "None", ...
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return absl::StrCat(TypeName(v), " object");
}

bool IsSeq(const Value& v, bool include_range) {
  if (v.kind() != Kind::kList) return false;
  const SeqKind k = v.list().kind;
  return k == SeqKind::kList || k == SeqKind::kTuple || (include_range && k == SeqKind::kRange);
}

double PyFloorDivFloat(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) div -= 1.0;
  }
  if (div != 0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, vx / wx);
}

double PyModFloat(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  if (mod != 0) {
    if ((wx < 0) != (mod < 0)) mod += wx;
  } else {
    mod = std::copysign(0.0, wx);
  }
  return mod;
}

const char* OpSymbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSub:
      return "-";
    case BinaryOp::kMul:
      return "*";
    case BinaryOp::kDiv:
      return "/";
    case BinaryOp::kFloorDiv:
      return "//";
    case BinaryOp::kMod:
      return "%";
    case BinaryOp::kPow:
      return "** or pow()";
  }
  return "?";
}

absl::Status Unsupported(BinaryOp op, const Value& a, const Value& b) {
  return TypeError(
      absl::StrCat("unsupported operand type(s) for ", OpSymbol(op), ": '", TypeName(a), "' and '", TypeName(b), "'"));
}

// Python's slice.indices(length) for optional bounds.
void SliceIndices(int64_t length, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step,
                  int64_t* out_start, int64_t* out_stop) {
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? length - 1 : length;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x = x < -length ? lower : x + length;
      return std::max(x, lower);
    }
    return std::min(x, upper);
  };
  *out_start = clamp(start, step < 0 ? upper : lower);
  *out_stop = clamp(stop, step < 0 ? lower : upper);
}

// Evaluation at parse time reached a name or a call: not a constant.
absl::Status NotConstant() { return absl::AbortedError("not a constant"); }

// jinja2's has_safe_repr: values the compiler can write as a literal.
bool SafeRepr(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone:
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kString:
      return true;
    case Kind::kList: {
      const SeqKind k = v.list().kind;
      if (k == SeqKind::kRange) return true;
      if (k != SeqKind::kList && k != SeqKind::kTuple) return false;
      for (const Value& item : v.list().items) {
        if (!SafeRepr(item)) return false;
      }
      return true;
    }
    case Kind::kDict:
      for (const auto& kv : v.dict().items()) {
        if (!SafeRepr(kv.second)) return false;
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status AtLine(int line, const absl::Status& status) {
  if (status.ok() || absl::StartsWith(status.message(), AV(kLinePrefix))) return status;
  return absl::Status(status.code(), LineMessage(line, std::string(status.message())));
}

Interpreter::Interpreter(const Limits& limits, std::function<std::tm()> now) : limits_(limits), now_(std::move(now)) {}

Interpreter::~Interpreter() {
  for (auto& ns : namespaces_) ns->Clear();
  for (auto& scope : macro_scopes_) scope->vars.clear();
}

std::tm Interpreter::Now() const {
  if (now_) return now_();
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

void Interpreter::Track(const std::shared_ptr<DictData>& ns) { namespaces_.push_back(ns); }

absl::Status Interpreter::Step() {
  if (++steps_ > limits_.max_steps) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the template did more than ", limits_.max_steps, " steps of work"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ChargeString(size_t bytes) {
  if (bytes > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the template built a string of ", bytes,
                                                     " bytes, more than the limit of ", limits_.max_output_bytes));
  }
  steps_ += static_cast<int64_t>(bytes / 64);
  return Step();
}

absl::Status Interpreter::ChargeList(size_t items) {
  if (items > static_cast<size_t>(limits_.max_loop_iterations)) {
    return absl::ResourceExhaustedError(absl::StrCat("the template built a list of ", items,
                                                     " items, more than the limit of ", limits_.max_loop_iterations));
  }
  steps_ += static_cast<int64_t>(items / 8);
  return Step();
}

absl::Status Interpreter::Append(std::string_view text, std::string* out) {
  out->append(text);
  if (out->size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the output exceeds the limit of ", limits_.max_output_bytes, " bytes"));
  }
  steps_ += static_cast<int64_t>(text.size() / 64);
  return absl::OkStatus();
}

absl::Status Interpreter::Render(const TemplateAst& ast, const DictData& variables, std::string* out) {
  variables_ = &variables;
  auto root = std::make_shared<Scope>();
  ASSIGN_OR_RETURN(Flow flow, Exec(ast.body, root, out));
  (void)flow;
  return absl::OkStatus();
}

Value Interpreter::Lookup(const std::string& name, const ScopePtr& scope) const {
  for (const Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (variables_ != nullptr) {
    if (const Value* v = variables_->Find(name)) return *v;
  }
  if (const Value* v = Globals().Find(name)) return *v;
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

// ---- attribute and item access ----

absl::StatusOr<Value> Interpreter::GetAttr(const Value& obj, std::string_view name) {
  RETURN_IF_ERROR(Step());
  const std::string missing = absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute '", AV(name), "'");
  switch (obj.kind()) {
    case Kind::kUndefined:
      return UndefinedError(obj);
    case Kind::kDict:
    case Kind::kString:
    case Kind::kList: {
      bool found = false;
      Value m = GetMethod(obj, name, &found);
      if (found) return m;
      if (obj.kind() == Kind::kDict) {
        if (const Value* v = obj.dict().Find(name)) return *v;
      }
      return Value::Undefined(missing);
    }
    case Kind::kNamespace:
      if (const Value* v = obj.ns().Find(name)) return *v;
      return Value::Undefined(missing);
    case Kind::kObject:
      if (const Value* v = obj.object().attrs.Find(name)) return *v;
      return Value::Undefined(missing);
    default:
      return Value::Undefined(missing);
  }
}

absl::StatusOr<Value> Interpreter::GetItem(const Value& obj, const Value& key) {
  RETURN_IF_ERROR(Step());
  if (obj.is_undefined()) return UndefinedError(obj);
  switch (obj.kind()) {
    case Kind::kDict:
      if (key.is_string()) {
        if (const Value* v = obj.dict().Find(key.str())) return *v;
      }
      break;
    case Kind::kList:
      if (key.is_integer_like() && obj.list().kind != SeqKind::kDictKeys && obj.list().kind != SeqKind::kDictValues &&
          obj.list().kind != SeqKind::kDictItems) {
        const auto& items = obj.list().items;
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
      }
      break;
    case Kind::kString:
      if (key.is_integer_like()) {
        const std::string& s = obj.str();
        int64_t i = key.as_int();
        if (text::IsAscii(s)) {
          if (i < 0) i += static_cast<int64_t>(s.size());
          if (i >= 0 && i < static_cast<int64_t>(s.size())) {
            return Value::String(std::string(1, s[static_cast<size_t>(i)]));
          }
        } else {
          std::vector<char32_t> cps = text::Decode(s);
          if (i < 0) i += static_cast<int64_t>(cps.size());
          if (i >= 0 && i < static_cast<int64_t>(cps.size())) {
            return Value::String(text::Encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
          }
        }
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.kind() == Kind::kNamespace || obj.kind() == Kind::kObject) return GetAttr(obj, key.str());
    bool found = false;
    Value m = GetMethod(obj, key.str(), &found);
    if (found) return m;
  }
  absl::StatusOr<std::string> r = key.is_string() ? Repr(key) : ToStr(key);
  const std::string shown = r.ok() ? *r : TypeName(key);
  if (key.is_string()) {
    return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(obj), "' has no attribute ", shown));
  }
  return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element ", shown));
}

absl::StatusOr<Value> Interpreter::EvalSlice(const Value& obj, const Expr& slice, const ScopePtr& scope) {
  // jinja2 compiles a slice to plain Python subscripting (no sandbox
  // getitem): errors propagate instead of giving undefined. At parse time
  // (const_mode_) it goes through the sandbox's getitem, which turns a
  // TypeError into undefined.
  std::optional<int64_t> bounds[3];
  bool bad_bound = false;
  for (int k = 0; k < 3; ++k) {
    if (!slice.operands[k]) continue;
    ASSIGN_OR_RETURN(Value v, Eval(*slice.operands[k], scope));
    if (v.is_none()) continue;
    if (!v.is_integer_like()) {
      bad_bound = true;
      continue;
    }
    bounds[k] = v.as_int();
  }
  if (obj.is_undefined()) return UndefinedError(obj);
  if (const_mode_ && (bad_bound || (!obj.is_string() && !IsSeq(obj, true)))) {
    return Value::Undefined(absl::StrCat(ObjectTypeRepr(obj), " has no element slice"));
  }
  if (obj.kind() == Kind::kDict) return TypeError("unhashable type: 'slice'");
  if (obj.kind() == Kind::kList && obj.list().kind == SeqKind::kRange) {
    return absl::UnimplementedError("slicing a range is not supported");
  }
  if (!obj.is_string() && !IsSeq(obj, false)) {
    return TypeError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }
  if (bad_bound) return TypeError("slice indices must be integers or None or have an __index__ method");
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  auto pick = [&](int64_t length, auto&& emit) {
    int64_t start, stop;
    SliceIndices(length, bounds[0], bounds[1], step, &start, &stop);
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) emit(static_cast<size_t>(i));
  };
  if (obj.is_string()) {
    const std::string& s = obj.str();
    std::string out;
    if (text::IsAscii(s)) {
      pick(static_cast<int64_t>(s.size()), [&](size_t i) { out.push_back(s[i]); });
    } else {
      std::vector<char32_t> cps = text::Decode(s);
      pick(static_cast<int64_t>(cps.size()), [&](size_t i) { text::AppendUtf8(cps[i], &out); });
    }
    RETURN_IF_ERROR(ChargeString(out.size()));
    return Value::String(std::move(out));
  }
  const auto& items = obj.list().items;
  std::vector<Value> out;
  pick(static_cast<int64_t>(items.size()), [&](size_t i) { out.push_back(items[i]); });
  RETURN_IF_ERROR(ChargeList(out.size()));
  return Value::List(std::move(out), obj.list().kind);
}

// ---- calls ----

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (callee.kind() != Kind::kCallable) {
    return TypeError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
  }
  return callee.callable().fn(*this, args);
}

absl::StatusOr<Value> Interpreter::CallFilter(std::string_view name, const Value& input, CallArgs& args) {
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) {
    if (IsJinjaFilter(name)) return absl::UnimplementedError(absl::StrCat("filter '", AV(name), "' is not supported"));
    return absl::InvalidArgumentError(absl::StrCat("no filter named '", AV(name), "'"));
  }
  RETURN_IF_ERROR(Step());
  return fn(*this, input, args);
}

absl::StatusOr<bool> Interpreter::CallTest(std::string_view name, const Value& input, CallArgs& args) {
  TestFn fn = FindTest(name);
  if (fn == nullptr) {
    if (IsJinjaTest(name)) return absl::UnimplementedError(absl::StrCat("test '", AV(name), "' is not supported"));
    return absl::InvalidArgumentError(absl::StrCat("no test named '", AV(name), "'"));
  }
  RETURN_IF_ERROR(Step());
  return fn(*this, input, args);
}

absl::StatusOr<Value> Interpreter::CallMacro(const Stmt& macro, const ScopePtr& defining, CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("macro calls nest more than ", limits_.max_call_depth, " deep"));
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = defining;
  const size_t n = macro.params.size();
  if (args.positional.size() > n) {
    return TypeError(absl::StrCat("macro '", macro.name, "' takes not more than ", n, " argument(s)"));
  }
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope->vars[macro.params[i]] = args.positional[i];
    bound[i] = true;
  }
  for (auto& [key, value] : args.keyword) {
    auto it = std::find(macro.params.begin(), macro.params.end(), key);
    if (it == macro.params.end()) {
      return TypeError(absl::StrCat("macro '", macro.name, "' takes no keyword argument '", key, "'"));
    }
    const size_t i = static_cast<size_t>(it - macro.params.begin());
    if (bound[i]) {
      return TypeError(absl::StrCat("macro '", macro.name, "' got multiple values for argument '", key, "'"));
    }
    scope->vars[key] = value;
    bound[i] = true;
  }
  const size_t first_default = n - macro.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      ASSIGN_OR_RETURN(Value d, Eval(*macro.defaults[i - first_default], scope));
      scope->vars[macro.params[i]] = std::move(d);
    } else {
      scope->vars[macro.params[i]] =
          Value::Undefined(absl::StrCat("parameter '", macro.params[i], "' was not provided"));
    }
  }
  ++call_depth_;
  std::string out;
  absl::StatusOr<Flow> flow = Exec(macro.body, scope, &out);
  --call_depth_;
  RETURN_IF_ERROR(flow.status());
  return Value::String(std::move(out));
}

absl::Status Interpreter::EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs* args) {
  args->line = e.line;
  for (size_t i = first; i < e.operands.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.operands[i], scope));
    args->positional.push_back(std::move(v));
  }
  for (const auto& k : e.keywords) {
    ASSIGN_OR_RETURN(Value v, Eval(*k.value, scope));
    args->keyword.emplace_back(k.name, std::move(v));
  }
  return absl::OkStatus();
}

// ---- expressions ----

absl::StatusOr<Value> Interpreter::Eval(const Expr& e, const ScopePtr& scope) {
  absl::StatusOr<Value> v = EvalInner(e, scope);
  if (!v.ok()) return AtLine(e.line, v.status());
  return v;
}

absl::StatusOr<Value> Interpreter::Arith(BinaryOp op, const Value& a, const Value& b) {
  if (a.is_string() && op == BinaryOp::kMod) {
    return absl::UnimplementedError("string formatting with % is not supported");
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool ints = a.is_integer_like() && b.is_integer_like();
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinaryOp::kAdd:
      if (ints) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() + b.as_double());
      if (a.is_string() && b.is_string()) {
        RETURN_IF_ERROR(ChargeString(a.str().size() + b.str().size()));
        return Value::String(a.str() + b.str());
      }
      if (IsSeq(a, false) && IsSeq(b, false) && a.list().kind == b.list().kind) {
        std::vector<Value> items = a.list().items;
        items.insert(items.end(), b.list().items.begin(), b.list().items.end());
        RETURN_IF_ERROR(ChargeList(items.size()));
        return Value::List(std::move(items), a.list().kind);
      }
      if (a.is_string() || IsSeq(a, false)) {
        return TypeError(
            absl::StrCat("can only concatenate ", TypeName(a), " (not \"", TypeName(b), "\") to ", TypeName(a)));
      }
      return Unsupported(op, a, b);
    case BinaryOp::kSub:
      if (ints) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() - b.as_double());
      return Unsupported(op, a, b);
    case BinaryOp::kMul: {
      if (ints) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      if (nums) return Value::Float(a.as_double() * b.as_double());
      const Value* seq = nullptr;
      const Value* count = nullptr;
      if (b.is_integer_like() && (a.is_string() || IsSeq(a, false))) {
        seq = &a;
        count = &b;
      } else if (a.is_integer_like() && (b.is_string() || IsSeq(b, false))) {
        seq = &b;
        count = &a;
      }
      if (seq == nullptr) {
        if (a.is_string() || IsSeq(a, false) || b.is_string() || IsSeq(b, false)) {
          return TypeError(
              absl::StrCat("can't multiply sequence by non-int of type '", TypeName(a.is_number() ? a : b), "'"));
        }
        return Unsupported(op, a, b);
      }
      const int64_t n = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        const std::string& s = seq->str();
        if (!s.empty() && static_cast<uint64_t>(n) > limits_.max_output_bytes / s.size()) {
          return ChargeString(limits_.max_output_bytes + 1);
        }
        RETURN_IF_ERROR(ChargeString(s.size() * static_cast<size_t>(n)));
        std::string out;
        out.reserve(s.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += s;
        return Value::String(std::move(out));
      }
      const auto& items = seq->list().items;
      if (!items.empty() &&
          static_cast<uint64_t>(n) > static_cast<uint64_t>(limits_.max_loop_iterations) / items.size()) {
        return ChargeList(static_cast<size_t>(limits_.max_loop_iterations) + 1);
      }
      RETURN_IF_ERROR(ChargeList(items.size() * static_cast<size_t>(n)));
      std::vector<Value> out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      return Value::List(std::move(out), seq->list().kind);
    }
    case BinaryOp::kDiv:
      if (!nums) return Unsupported(op, a, b);
      if (b.as_double() == 0) {
        return TypeError(ints ? "division by zero" : "float division by zero");
      }
      if (ints) return Value::Float(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
      return Value::Float(a.as_double() / b.as_double());
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod:
      if (a.is_string() && op == BinaryOp::kMod) {
        return absl::UnimplementedError("string formatting with % is not supported");
      }
      if (!nums) return Unsupported(op, a, b);
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) return TypeError("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          if (op == BinaryOp::kMod) return Value::Int(0);
          return IntegerOverflow();
        }
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          q -= 1;
          r += y;
        }
        return Value::Int(op == BinaryOp::kFloorDiv ? q : r);
      }
      if (b.as_double() == 0) {
        return TypeError(op == BinaryOp::kMod ? "float modulo" : "float floor division by zero");
      }
      if (op == BinaryOp::kFloorDiv) return Value::Float(PyFloorDivFloat(a.as_double(), b.as_double()));
      return Value::Float(PyModFloat(a.as_double(), b.as_double()));
    case BinaryOp::kPow: {
      if (!nums) return Unsupported(op, a, b);
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), exp = b.as_int(), result = 1;
        while (exp > 0) {
          if (exp & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return IntegerOverflow();
          }
          exp >>= 1;
          if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return IntegerOverflow();
        }
        return Value::Int(result);
      }
      const double x = a.as_double(), y = b.as_double();
      if (x == 0 && y < 0) return TypeError("0.0 cannot be raised to a negative power");
      if (x < 0 && std::isfinite(y) && y != std::floor(y)) {
        return absl::UnimplementedError("a power with a complex result is not supported");
      }
      const double r = std::pow(x, y);
      if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) {
        return TypeError("(34, 'Numerical result out of range')");
      }
      return Value::Float(r);
    }
  }
  return Unsupported(op, a, b);
}

absl::StatusOr<Value> Interpreter::EvalCompare(const Expr& e, const ScopePtr& scope) {
  ASSIGN_OR_RETURN(Value left, Eval(*e.operands[0], scope));
  for (size_t i = 0; i < e.compare_ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.operands[i + 1], scope));
    bool result = false;
    switch (e.compare_ops[i]) {
      case CompareOp::kEq:
        result = Equals(left, right);
        break;
      case CompareOp::kNe:
        result = !Equals(left, right);
        break;
      case CompareOp::kIn:
      case CompareOp::kNotIn: {
        ASSIGN_OR_RETURN(bool in, Contains(right, left));
        result = e.compare_ops[i] == CompareOp::kIn ? in : !in;
        break;
      }
      default: {
        static const char* kNames[] = {"==", "!=", "<", "<=", ">", ">="};
        const CompareOp op = e.compare_ops[i];
        ASSIGN_OR_RETURN(int c, Compare(left, right, kNames[static_cast<int>(op)]));
        if (c == 2) {
          result = false;
        } else if (op == CompareOp::kLt) {
          result = c < 0;
        } else if (op == CompareOp::kLe) {
          result = c <= 0;
        } else if (op == CompareOp::kGt) {
          result = c > 0;
        } else {
          result = c >= 0;
        }
      }
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

absl::StatusOr<Value> Interpreter::EvalInner(const Expr& e, const ScopePtr& scope) {
  RETURN_IF_ERROR(Step());
  switch (e.type) {
    case ExprType::kConst:
      return e.constant;
    case ExprType::kName:
      if (const_mode_) return NotConstant();
      return Lookup(e.name, scope);
    case ExprType::kList:
    case ExprType::kTuple: {
      std::vector<Value> items;
      for (const auto& o : e.operands) {
        ASSIGN_OR_RETURN(Value v, Eval(*o, scope));
        items.push_back(std::move(v));
      }
      Value l = Value::List(std::move(items), e.type == ExprType::kList ? SeqKind::kList : SeqKind::kTuple);
      if (l.depth() > kMaxValueDepth) {
        return absl::ResourceExhaustedError(absl::StrCat("values nest more than ", kMaxValueDepth, " deep"));
      }
      return l;
    }
    case ExprType::kDict: {
      auto d = std::make_shared<DictData>();
      for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
        ASSIGN_OR_RETURN(Value k, Eval(*e.operands[i], scope));
        ASSIGN_OR_RETURN(Value v, Eval(*e.operands[i + 1], scope));
        if (!k.is_string()) {
          return absl::UnimplementedError(
              absl::StrCat("dict keys of type '", TypeName(k), "' are not supported (only str)"));
        }
        d->Set(k.str(), std::move(v));
      }
      if (d->depth() > kMaxValueDepth) {
        return absl::ResourceExhaustedError(absl::StrCat("values nest more than ", kMaxValueDepth, " deep"));
      }
      return Value::Dict(std::move(d));
    }
    case ExprType::kGetattr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], scope));
      return GetAttr(obj, e.name);
    }
    case ExprType::kGetitem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.operands[0], scope));
      if (e.operands[1]->type == ExprType::kSlice) return EvalSlice(obj, *e.operands[1], scope);
      ASSIGN_OR_RETURN(Value key, Eval(*e.operands[1], scope));
      return GetItem(obj, key);
    }
    case ExprType::kSlice:
      return absl::InvalidArgumentError("a slice outside a subscript");
    case ExprType::kCall: {
      if (const_mode_) return NotConstant();
      ASSIGN_OR_RETURN(Value callee, Eval(*e.operands[0], scope));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
      return CallValue(callee, args);
    }
    case ExprType::kFilter: {
      // jinja2 does not fold filters that take the render context.
      if (const_mode_ && (e.name == "map" || e.name == "select" || e.name == "reject" || e.name == "selectattr" ||
                          e.name == "rejectattr")) {
        return NotConstant();
      }
      ASSIGN_OR_RETURN(Value input, Eval(*e.operands[0], scope));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
      return CallFilter(e.name, input, args);
    }
    case ExprType::kTest: {
      ASSIGN_OR_RETURN(Value input, Eval(*e.operands[0], scope));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(e, 1, scope, &args));
      ASSIGN_OR_RETURN(bool r, CallTest(e.name, input, args));
      return Value::Bool(r);
    }
    case ExprType::kNeg:
    case ExprType::kPos: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], scope));
      if (v.is_undefined()) return UndefinedError(v);
      if (v.is_integer_like()) {
        if (e.type == ExprType::kPos) return Value::Int(v.as_int());
        if (v.as_int() == INT64_MIN) return IntegerOverflow();
        return Value::Int(-v.as_int());
      }
      if (v.kind() == Kind::kFloat) return Value::Float(e.type == ExprType::kNeg ? -v.as_double() : v.as_double());
      return TypeError(
          absl::StrCat("bad operand type for unary ", e.type == ExprType::kNeg ? "-" : "+", ": '", TypeName(v), "'"));
    }
    case ExprType::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.operands[0], scope));
      return Value::Bool(!Truthy(v));
    }
    case ExprType::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], scope));
      ASSIGN_OR_RETURN(Value b, Eval(*e.operands[1], scope));
      return Arith(e.binary_op, a, b);
    }
    case ExprType::kAnd:
    case ExprType::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.operands[0], scope));
      if (Truthy(a) == (e.type == ExprType::kOr)) return a;
      return Eval(*e.operands[1], scope);
    }
    case ExprType::kConcat: {
      std::string out;
      for (const auto& o : e.operands) {
        ASSIGN_OR_RETURN(Value v, Eval(*o, scope));
        ASSIGN_OR_RETURN(std::string s, ToStr(v));
        out += s;
        RETURN_IF_ERROR(ChargeString(out.size()));
      }
      return Value::String(std::move(out));
    }
    case ExprType::kCompare:
      return EvalCompare(e, scope);
    case ExprType::kCondExpr: {
      ASSIGN_OR_RETURN(Value test, Eval(*e.operands[0], scope));
      if (Truthy(test)) return Eval(*e.operands[1], scope);
      if (e.operands[2]) return Eval(*e.operands[2], scope);
      return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                           " evaluated to false and no else section was defined."));
    }
  }
  return absl::InternalError("unknown expression");
}

// ---- statements ----

absl::StatusOr<Interpreter::Flow> Interpreter::Exec(const Body& body, const ScopePtr& scope, std::string* out) {
  for (const auto& s : body) {
    absl::StatusOr<Flow> flow = ExecStmt(*s, scope, out);
    if (!flow.ok()) return AtLine(s->line, flow.status());
    if (*flow != Flow::kNormal) return *flow;
  }
  return Flow::kNormal;
}

absl::Status Interpreter::Assign(const Target& t, const Value& v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::Kind::kName:
      scope->vars[t.name] = v;
      return absl::OkStatus();
    case Target::Kind::kTuple: {
      if (v.is_undefined()) return UndefinedError(v);
      ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
      if (items.size() < t.items.size()) {
        return TypeError(
            absl::StrCat("not enough values to unpack (expected ", t.items.size(), ", got ", items.size(), ")"));
      }
      if (items.size() > t.items.size()) {
        return TypeError(absl::StrCat("too many values to unpack (expected ", t.items.size(), ")"));
      }
      for (size_t i = 0; i < items.size(); ++i) RETURN_IF_ERROR(Assign(t.items[i], items[i], scope));
      return absl::OkStatus();
    }
    case Target::Kind::kNamespaceAttr: {
      Value ns = Lookup(t.name, scope);
      if (ns.kind() != Kind::kNamespace) {
        return AtLine(t.line, TypeError("cannot assign attribute on non-namespace object"));
      }
      if (v.depth() + 1 > kMaxValueDepth) {
        return absl::ResourceExhaustedError(absl::StrCat("values nest more than ", kMaxValueDepth, " deep"));
      }
      ns.ns().Set(t.attr, v);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecFor(const Stmt& s, const ScopePtr& scope, std::string* out) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
  absl::StatusOr<std::vector<Value>> all = Iterate(iterable);
  if (!all.ok()) return AtLine(s.expr->line, all.status());
  std::vector<Value> items;
  if (s.filter) {
    for (Value& item : *all) {
      auto fscope = std::make_shared<Scope>();
      fscope->parent = scope;
      RETURN_IF_ERROR(Assign(s.target, item, fscope));
      ASSIGN_OR_RETURN(Value keep, Eval(*s.filter, fscope));
      if (Truthy(keep)) items.push_back(std::move(item));
    }
  } else {
    items = std::move(*all);
  }
  const int64_t length = static_cast<int64_t>(items.size());
  // jinja2 runs the else block unless some iteration reached the end of the
  // body: a loop whose iterations all end in break / continue runs it too.
  bool completed_an_iteration = false;
  for (int64_t i = 0; i < length; ++i) {
    if (++iterations_ > limits_.max_loop_iterations) {
      return absl::ResourceExhaustedError(
          absl::StrCat("loops ran more than ", limits_.max_loop_iterations, " iterations in all"));
    }
    RETURN_IF_ERROR(Step());
    auto iter_scope = std::make_shared<Scope>();
    iter_scope->parent = scope;
    RETURN_IF_ERROR(Assign(s.target, items[static_cast<size_t>(i)], iter_scope));
    auto loop = std::make_shared<ObjectData>();
    loop->type_name = "LoopContext";
    DictData& a = loop->attrs;
    a.Set("index0", Value::Int(i));
    a.Set("index", Value::Int(i + 1));
    a.Set("revindex0", Value::Int(length - i - 1));
    a.Set("revindex", Value::Int(length - i));
    a.Set("first", Value::Bool(i == 0));
    a.Set("last", Value::Bool(i == length - 1));
    a.Set("length", Value::Int(length));
    a.Set("depth", Value::Int(1));
    a.Set("depth0", Value::Int(0));
    a.Set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("there is no previous item"));
    a.Set("nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value::Undefined("there is no next item"));
    a.Set("cycle", Value::Callable("cycle", [i](Interpreter&, CallArgs& args) -> absl::StatusOr<Value> {
            if (!args.keyword.empty()) return TypeError("cycle() takes no keyword arguments");
            if (args.positional.empty()) return TypeError("no items for cycling given");
            return args.positional[static_cast<size_t>(i) % args.positional.size()];
          }));
    iter_scope->vars["loop"] = Value::Object(std::move(loop));
    ASSIGN_OR_RETURN(Flow flow, Exec(s.body, iter_scope, out));
    if (flow == Flow::kBreak) break;
    if (flow == Flow::kNormal) completed_an_iteration = true;
  }
  if (!completed_an_iteration && !s.else_body.empty()) {
    auto else_scope = std::make_shared<Scope>();
    else_scope->parent = scope;
    ASSIGN_OR_RETURN(Flow flow, Exec(s.else_body, else_scope, out));
    return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecStmt(const Stmt& s, const ScopePtr& scope, std::string* out) {
  RETURN_IF_ERROR(Step());
  switch (s.type) {
    case StmtType::kOutput:
      for (const auto& item : s.output) {
        if (!item.expr) {
          RETURN_IF_ERROR(Append(item.text, out));
          continue;
        }
        ASSIGN_OR_RETURN(Value v, Eval(*item.expr, scope));
        absl::StatusOr<std::string> str = ToStr(v);
        if (!str.ok()) return AtLine(item.expr->line, str.status());
        RETURN_IF_ERROR(Append(*str, out));
      }
      return Flow::kNormal;
    case StmtType::kIf:
      for (const auto& branch : s.branches) {
        ASSIGN_OR_RETURN(Value test, Eval(*branch.test, scope));
        if (Truthy(test)) return Exec(branch.body, scope, out);
      }
      return Exec(s.else_body, scope, out);
    case StmtType::kFor:
      return ExecFor(s, scope, out);
    case StmtType::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
      RETURN_IF_ERROR(Assign(s.target, v, scope));
      return Flow::kNormal;
    }
    case StmtType::kSetBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      std::string captured;
      ASSIGN_OR_RETURN(Flow flow, Exec(s.body, inner, &captured));
      (void)flow;
      RETURN_IF_ERROR(Assign(s.target, Value::String(std::move(captured)), scope));
      return Flow::kNormal;
    }
    case StmtType::kMacro: {
      const Stmt* node = &s;
      ScopePtr defining = scope;
      macro_scopes_.push_back(scope);
      scope->vars[s.name] =
          Value::Callable(s.name, [node, defining](Interpreter& interp, CallArgs& args) -> absl::StatusOr<Value> {
            return interp.CallMacro(*node, defining, args);
          });
      return Flow::kNormal;
    }
    case StmtType::kBreak:
      return Flow::kBreak;
    case StmtType::kContinue:
      return Flow::kContinue;
    case StmtType::kScope: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      return Exec(s.body, inner, out);
    }
  }
  return Flow::kNormal;
}

// ---- constant folding ----

namespace {

struct Folder {
  std::function<absl::StatusOr<Value>(const Expr&)> eval;

  void FoldExpr(ExprPtr& e) {
    if (!e) return;
    for (auto& o : e->operands) FoldExpr(o);
    for (auto& k : e->keywords) FoldExpr(k.value);
    if (e->type == ExprType::kConst || e->type == ExprType::kSlice) return;
    absl::StatusOr<Value> v = eval(*e);
    if (!v.ok() || !SafeRepr(*v)) return;
    auto c = std::make_unique<Expr>();
    c->type = ExprType::kConst;
    c->line = e->line;
    c->constant = std::move(*v);
    e = std::move(c);
  }

  void FoldBody(Body& body) {
    for (auto& s : body) {
      for (auto& item : s->output) {
        if (!item.expr) continue;
        FoldExpr(item.expr);
        absl::StatusOr<Value> v = eval(*item.expr);
        if (!v.ok()) continue;
        absl::StatusOr<std::string> text = ToStr(*v);
        if (!text.ok()) continue;
        item.text = std::move(*text);
        item.expr.reset();
      }
      for (auto& b : s->branches) {
        FoldExpr(b.test);
        FoldBody(b.body);
      }
      FoldExpr(s->expr);
      FoldExpr(s->filter);
      for (auto& d : s->defaults) FoldExpr(d);
      FoldBody(s->body);
      FoldBody(s->else_body);
    }
  }
};

}  // namespace

absl::Status FoldConstants(TemplateAst* ast, const Limits& limits) {
  Interpreter interp(limits, nullptr);
  interp.const_mode_ = true;
  const auto no_scope = std::make_shared<Interpreter::Scope>();
  Folder folder{[&](const Expr& e) { return interp.Eval(e, no_scope); }};
  folder.FoldBody(ast->body);
  return absl::OkStatus();
}

}  // namespace tandem::chat_template
