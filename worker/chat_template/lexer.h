// Lexer for the chat-template language (jinja2 syntax). Turns template
// source into tokens exactly as jinja2 3.1 does with trim_blocks=True and
// lstrip_blocks=True: newlines normalized to \n, one trailing newline
// dropped, `-` / `+` whitespace control on tags, comments and
// {% raw %} blocks consumed here. Errors name the template line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat_template {

enum class TokenType {
  kData,           // template text
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,  // text holds the operator: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type;
  std::string text;  // data, name, decoded string literal, operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Fails (InvalidArgument, "chat template line N: ...") on malformed source:
// invalid UTF-8, unterminated tags/comments/strings, unbalanced brackets,
// characters jinja2 rejects.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

// "chat template line N: message"
std::string LineMessage(int line, std::string_view message);

}  // namespace tandem::chat_template
