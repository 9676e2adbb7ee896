// Parser for the chat-template language: jinja2 syntax, the subset that
// Hugging Face chat templates use.
//
// Accepted: text, {{ expressions }}, {# comments #}, whitespace control
// (- and +), {% raw %}; statements if/elif/else, for (tuple targets, `if`
// filter, else, loop.*), set (names, tuples, ns.attr, block set), macro
// (positional and keyword parameters with defaults), break, continue,
// print, generation (transformers' assistant-mask tag, rendered as is);
// expressions: literals, lists, tuples, dicts, names, .attr, [item],
// slices, calls, filters and tests in the builtins tables, arithmetic,
// ~, comparisons, in / not in, and / or / not, x if c else y.
//
// Refused with "chat template line N: ... is not supported": extends,
// block, include, import, from, with, call, filter blocks, autoescape,
// recursive loops, *args / **kwargs in calls, macros that read varargs,
// kwargs or caller, filters and tests outside the tables. Syntax errors
// name the line too. Nesting deeper than limits.max_nesting is refused.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "worker/chat_template/ast.h"
#include "worker/chat_template/limits.h"

namespace tandem::chat_template {

absl::StatusOr<TemplateAst> ParseTemplate(std::string_view source, const Limits& limits);

}  // namespace tandem::chat_template
