// The filters, tests, methods and global functions templates can call:
// jinja2's builtins that chat templates use, plus the ones Hugging Face
// transformers adds (raise_exception, strftime_now, its own tojson).
// Internal to the library: the parser checks names against these tables,
// the interpreter calls them.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "worker/chat_template/value.h"

namespace tandem::chat_template {

class Interpreter;

using FilterFn = absl::StatusOr<Value> (*)(Interpreter& interp, const Value& input, CallArgs& args);
using TestFn = absl::StatusOr<bool> (*)(Interpreter& interp, const Value& input, CallArgs& args);

// nullptr when the filter / test is not supported.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);
// Whether jinja2 itself has the filter / test (to tell "not supported"
// from "unknown" in errors).
bool IsJinjaFilter(std::string_view name);
bool IsJinjaTest(std::string_view name);

// A method of a str, dict or list value (`s.strip`, `d.items`), bound to
// it; an undefined value when there is none (jinja2 then falls back to
// item lookup, or the sandbox refuses a mutating method).
Value GetMethod(const Value& self, std::string_view name, bool* found);

// The global functions: range, namespace, dict, raise_exception, strftime_now.
const DictData& Globals();

// Binds call arguments to named parameters, Python style: the last
// defaults.size() parameters are optional, the others required. Returns
// the bound values in parameter order.
absl::StatusOr<std::vector<Value>> BindArgs(std::string_view function, CallArgs& args,
                                            std::initializer_list<std::string_view> names, std::vector<Value> defaults);

}  // namespace tandem::chat_template
