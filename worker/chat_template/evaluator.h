// The interpreter: renders a parsed template (ast.h) with a set of
// variables, with jinja2's semantics as Hugging Face transformers
// configures it (ImmutableSandboxedEnvironment, default Undefined, loop
// controls): undefined names print as nothing, an attribute of an
// undefined value is an error, lists and dicts cannot be modified, loops
// and macros have their own scopes, `namespace()` carries values out.
//
// Errors name the template line ("chat template line N: ..."): runtime
// errors and raise_exception() are InvalidArgument, unsupported operations
// Unimplemented, limits.h bounds ResourceExhausted.
//
// One Interpreter renders one template once, on one thread.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/chat_template/ast.h"
#include "worker/chat_template/limits.h"
#include "worker/chat_template/value.h"

namespace tandem::chat_template {

class Interpreter {
 public:
  // `now` gives the local time for strftime_now(); null: the system clock.
  Interpreter(const Limits& limits, std::function<std::tm()> now);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `ast` with `variables` (the names the template reads) into *out.
  absl::Status Render(const TemplateAst& ast, const DictData& variables, std::string* out);

  // ---- for the builtins (builtins.h) ----
  // jinja2's sandboxed getattr (obj.name: attribute first, then item) and
  // getitem (obj[key]: item first, then attribute).
  absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs& args);
  absl::StatusOr<Value> CallFilter(std::string_view name, const Value& input, CallArgs& args);
  absl::StatusOr<bool> CallTest(std::string_view name, const Value& input, CallArgs& args);
  // Accounts for building a string or list of `bytes` bytes / `items`
  // items; fails past the limits.
  absl::Status ChargeString(size_t bytes);
  absl::Status ChargeList(size_t items);
  // Registers a namespace created during the render (cleared at the end,
  // which breaks reference cycles a template may have made).
  void Track(const std::shared_ptr<DictData>& ns);
  std::tm Now() const;
  const Limits& limits() const { return limits_; }

 private:
  friend absl::Status FoldConstants(TemplateAst* ast, const Limits& limits);
  struct Scope {
    std::shared_ptr<Scope> parent;
    std::unordered_map<std::string, Value> vars;
  };
  using ScopePtr = std::shared_ptr<Scope>;
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<Value> EvalInner(const Expr& e, const ScopePtr& scope);
  absl::Status EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs* args);
  absl::StatusOr<Value> Arith(BinaryOp op, const Value& a, const Value& b);
  absl::StatusOr<Value> EvalCompare(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<Value> EvalSlice(const Value& obj, const Expr& slice, const ScopePtr& scope);
  Value Lookup(const std::string& name, const ScopePtr& scope) const;

  absl::StatusOr<Flow> Exec(const Body& body, const ScopePtr& scope, std::string* out);
  absl::StatusOr<Flow> ExecStmt(const Stmt& s, const ScopePtr& scope, std::string* out);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, const ScopePtr& scope, std::string* out);
  absl::Status Assign(const Target& t, const Value& v, const ScopePtr& scope);
  absl::StatusOr<Value> CallMacro(const Stmt& macro, const ScopePtr& defining, CallArgs& args);
  absl::Status Append(std::string_view text, std::string* out);
  absl::Status Step();

  const Limits limits_;
  std::function<std::tm()> now_;
  // Evaluating at parse time (FoldConstants): names and calls are not
  // constant, and slices take getitem's semantics, as in jinja2's as_const.
  bool const_mode_ = false;
  const DictData* variables_ = nullptr;
  int64_t steps_ = 0;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<std::shared_ptr<DictData>> namespaces_;
  std::vector<ScopePtr> macro_scopes_;
};

// jinja2's compile-time constant folding (its optimizer and the folding of
// {{ }} children), which changes results in one place: a slice of
// constants is taken with the sandbox's getitem (failure gives undefined)
// where at run time it is plain subscripting (failure raises). Replaces
// every expression that evaluates without names or calls to a value with a
// literal representation by that value, and every constant {{ }} by its
// text. Never fails a template: what cannot be folded is left for run time.
absl::Status FoldConstants(TemplateAst* ast, const Limits& limits);

// "chat template line N: message" unless the message already names a line.
absl::Status AtLine(int line, const absl::Status& status);

}  // namespace tandem::chat_template
