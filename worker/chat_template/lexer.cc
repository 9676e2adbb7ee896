#include "worker/chat_template/lexer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/text.h"

namespace tandem::chat_template {
namespace {

absl::Status Error(int line, std::string_view message) {
  return absl::InvalidArgumentError(LineMessage(line, message));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python str.isspace at byte offset `pos`; *len gets the character's size.
bool SpaceAt(std::string_view s, size_t pos, size_t* len) {
  const unsigned char b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) {
    *len = 1;
    return text::IsSpace(b);
  }
  size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  n = std::min(n, s.size() - pos);
  *len = n;
  std::vector<char32_t> cps = text::Decode(s.substr(pos, n));
  return !cps.empty() && text::IsSpace(cps[0]);
}

size_t SkipSpaces(std::string_view s, size_t pos) {
  size_t len = 0;
  while (pos < s.size() && SpaceAt(s, pos, &len)) pos += len;
  return pos;
}

// Python's str.rstrip(): strips trailing whitespace.
std::string_view RStrip(std::string_view s) {
  return s.substr(0, text::Strip(s, text::StripSide::kRight, nullptr).size());
}

bool AllSpaces(std::string_view s) {
  if (s.empty()) return false;
  return SkipSpaces(s, 0) == s.size();
}

// Matches \d+(_\d+)* at pos; returns the end or npos.
size_t MatchDigits(std::string_view s, size_t pos) {
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string_view::npos;
  size_t i = pos;
  while (i < s.size() && IsDigit(s[i])) ++i;
  while (i + 1 < s.size() && s[i] == '_' && IsDigit(s[i + 1])) {
    ++i;
    while (i < s.size() && IsDigit(s[i])) ++i;
  }
  return i;
}

size_t MatchExponent(std::string_view s, size_t pos) {
  if (pos >= s.size() || (s[pos] != 'e' && s[pos] != 'E')) return std::string_view::npos;
  size_t i = pos + 1;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  return MatchDigits(s, i);
}

// jinja2's float_re at pos (not preceded by '.'); returns the end or npos.
size_t MatchFloat(std::string_view s, size_t pos) {
  if (pos > 0 && s[pos - 1] == '.') return std::string_view::npos;
  const size_t e1 = MatchDigits(s, pos);
  if (e1 == std::string_view::npos) return e1;
  if (size_t e = MatchExponent(s, e1); e != std::string_view::npos) return e;
  if (e1 < s.size() && s[e1] == '.') {
    const size_t f = MatchDigits(s, e1 + 1);
    if (f == std::string_view::npos) return f;
    if (size_t e = MatchExponent(s, f); e != std::string_view::npos) return e;
    return f;
  }
  return std::string_view::npos;
}

// jinja2's integer_re at pos; returns the end or npos; *base gets the base.
size_t MatchInteger(std::string_view s, size_t pos, int* base) {
  auto prefixed = [&](char letter, int b) -> size_t {
    if (pos + 1 >= s.size() || s[pos] != '0' || (s[pos + 1] | 0x20) != letter) {
      return std::string_view::npos;
    }
    size_t i = pos + 2;
    size_t digits = 0;
    while (i < s.size()) {
      size_t j = i;
      if (s[j] == '_') ++j;
      if (j >= s.size()) break;
      const int v = HexValue(s[j]);
      if (v < 0 || v >= b) break;
      i = j + 1;
      ++digits;
    }
    if (digits == 0) return std::string_view::npos;
    *base = b;
    return i;
  };
  for (auto [letter, b] : {std::pair{'b', 2}, std::pair{'o', 8}, std::pair{'x', 16}}) {
    if (size_t e = prefixed(letter, b); e != std::string_view::npos) return e;
  }
  if (pos >= s.size() || !IsDigit(s[pos])) return std::string_view::npos;
  *base = 10;
  const char first = s[pos];
  size_t i = pos + 1;
  while (i < s.size()) {
    size_t j = i;
    if (s[j] == '_') ++j;
    if (j >= s.size() || !IsDigit(s[j]) || (first == '0' && s[j] != '0')) break;
    i = j + 1;
  }
  return i;
}

// Decodes a string literal body as jinja2 does: newlines already
// normalized, then .encode("ascii", "backslashreplace").decode("unicode-escape").
absl::StatusOr<std::string> DecodeStringLiteral(std::string_view body, int line) {
  std::string out;
  size_t i = 0;
  while (i < body.size()) {
    const char c = body[i];
    if (c != '\\') {
      out.push_back(c);
      ++i;
      continue;
    }
    const char next = body[i + 1];  // the lexer guarantees a character after '\'
    if (static_cast<unsigned char>(next) >= 0x80) {
      // backslashreplace turned the character into \xhh / \uhhhh / \Uhhhhhhhh,
      // so this backslash escapes the backslash of that sequence.
      size_t n = static_cast<unsigned char>(next) >= 0xF0 ? 4 : static_cast<unsigned char>(next) >= 0xE0 ? 3 : 2;
      const char32_t cp = text::Decode(body.substr(i + 1, n))[0];
      char buf[16];
      if (cp <= 0xFF) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      }
      out.append(buf);
      i += 1 + n;
      continue;
    }
    i += 2;
    switch (next) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t digits = next == 'x' ? 2 : next == 'u' ? 4 : 8;
        char32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          const int v = i + k < body.size() ? HexValue(body[i + k]) : -1;
          if (v < 0) {
            return Error(line, absl::StrCat("truncated \\", std::string(1, next), " escape in a string"));
          }
          cp = cp * 16 + static_cast<char32_t>(v);
        }
        i += digits;
        if (cp > 0x10FFFF) return Error(line, "illegal Unicode character in a string escape");
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          return Error(line, "surrogate code points in string escapes are not supported");
        }
        text::AppendUtf8(cp, &out);
        break;
      }
      case 'N':
        return Error(line, "\\N{...} escapes are not supported");
      default:
        if (next >= '0' && next <= '7') {
          char32_t cp = static_cast<char32_t>(next - '0');
          for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k, ++i) {
            cp = cp * 8 + static_cast<char32_t>(body[i] - '0');
          }
          text::AppendUtf8(cp, &out);
        } else {
          out.push_back('\\');
          out.push_back(next);
        }
    }
  }
  return out;
}

constexpr std::string_view kOperators[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                           "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t open = FindOpener(pos);
      if (open == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[open + 1];
      size_t after = open + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after];
      size_t raw_end = kind == '%' ? MatchRawBegin(open) : std::string::npos;
      EmitLeadingText(pos, open, sign, /*is_variable=*/kind == '{');
      if (sign != 0) ++after;
      if (raw_end != std::string::npos) {
        line_starting_ = src_[raw_end - 1] == '\n';
        ASSIGN_OR_RETURN(pos, Raw(raw_end, LineAt(open)));
      } else if (kind == '#') {
        ASSIGN_OR_RETURN(pos, Comment(after, LineAt(open)));
      } else {
        ASSIGN_OR_RETURN(pos, Tag(after, kind == '{', open));
      }
    }
    tokens_.push_back(Token{TokenType::kEof, "", 0, 0, LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin());
  }

  void Emit(TokenType type, std::string text, size_t pos) {
    if (type == TokenType::kData && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), 0, 0, LineAt(pos)});
  }

  size_t FindOpener(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string::npos || pos + 1 >= src_.size()) return std::string::npos;
      const char c = src_[pos + 1];
      if (c == '{' || c == '%' || c == '#') return pos;
      ++pos;
    }
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at pos: returns the end of the match.
  size_t MatchRawBegin(size_t pos) const {
    size_t i = pos + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = SkipSpaces(src_, i);
    if (src_.compare(i, 3, "raw") != 0) return std::string::npos;
    i = SkipSpaces(src_, i + 3);
    if (src_.compare(i, 3, "-%}") == 0) return SkipSpaces(src_, i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return std::string::npos;
  }

  // Text before a tag, with `-` (strip all whitespace before the tag) or
  // lstrip_blocks (strip spaces between the line start and a block tag).
  void EmitLeadingText(size_t pos, size_t open, char sign, bool is_variable) {
    std::string_view text(src_.data() + pos, open - pos);
    if (sign == '-') {
      text = RStrip(text);
    } else if (sign != '+' && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && AllSpaces(text.substr(l_pos))) text = text.substr(0, l_pos);
    }
    Emit(TokenType::kData, std::string(text), pos);
  }

  absl::StatusOr<size_t> Comment(size_t start, int open_line) {
    // jinja2 accepts an opener at the very end of the template.
    if (start >= src_.size()) return src_.size();
    const size_t j = src_.find("#}", start);
    if (j == std::string::npos) return Error(open_line, "unterminated comment: '{#' needs '#}'");
    size_t k = j;
    if (j > start && (src_[j - 1] == '+' || src_[j - 1] == '-')) k = j - 1;
    size_t end;
    if (src_[k] == '+') {
      end = k + 3;
    } else if (src_[k] == '-') {
      end = SkipSpaces(src_, k + 3);
    } else {
      end = j + 2;
      if (end < src_.size() && src_[end] == '\n') ++end;
    }
    line_starting_ = src_[end - 1] == '\n';
    return end;
  }

  absl::StatusOr<size_t> Raw(size_t start, int open_line) {
    if (start >= src_.size()) return src_.size();
    size_t k = start;
    while ((k = src_.find("{%", k)) != std::string::npos) {
      size_t i = k + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      i = SkipSpaces(src_, i);
      if (src_.compare(i, 6, "endraw") == 0) {
        i = SkipSpaces(src_, i + 6);
        size_t end = std::string::npos;
        if (src_.compare(i, 3, "+%}") == 0) {
          end = i + 3;
        } else if (src_.compare(i, 3, "-%}") == 0) {
          end = SkipSpaces(src_, i + 3);
        } else if (src_.compare(i, 2, "%}") == 0) {
          end = i + 2;
          if (end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          EmitLeadingText(start, k, sign, false);
          line_starting_ = src_[end - 1] == '\n';
          return end;
        }
      }
      k += 2;
    }
    return Error(open_line, "unterminated raw block: '{% raw %}' needs '{% endraw %}'");
  }

  absl::StatusOr<size_t> Tag(size_t pos, bool variable, size_t open) {
    const int open_line = LineAt(open);
    Emit(variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, variable ? "{{" : "{%", open);
    std::vector<char> closers;
    while (true) {
      if (pos >= src_.size()) {
        return Error(open_line, absl::StrCat("unexpected end of template: '", variable ? "{{" : "{%",
                                             "' is not closed with '", variable ? "}}" : "%}", "'"));
      }
      if (closers.empty()) {
        size_t end = std::string::npos;
        if (variable) {
          if (src_.compare(pos, 3, "-}}") == 0) {
            end = SkipSpaces(src_, pos + 3);
          } else if (src_.compare(pos, 2, "}}") == 0) {
            end = pos + 2;
          }
        } else if (src_.compare(pos, 3, "+%}") == 0) {
          end = pos + 3;
        } else if (src_.compare(pos, 3, "-%}") == 0) {
          end = SkipSpaces(src_, pos + 3);
        } else if (src_.compare(pos, 2, "%}") == 0) {
          end = pos + 2;
          if (end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          Emit(variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, variable ? "}}" : "%}", pos);
          line_starting_ = src_[end - 1] == '\n';
          return end;
        }
      }
      size_t len = 0;
      if (SpaceAt(src_, pos, &len)) {
        pos = SkipSpaces(src_, pos);
        continue;
      }
      const int line = LineAt(pos);
      if (size_t e = MatchFloat(src_, pos); e != std::string::npos) {
        std::string digits;
        for (size_t k = pos; k < e; ++k) {
          if (src_[k] != '_') digits.push_back(src_[k]);
        }
        Token t{TokenType::kFloat, src_.substr(pos, e - pos), 0, std::strtod(digits.c_str(), nullptr), line};
        tokens_.push_back(std::move(t));
        pos = e;
        continue;
      }
      int base = 10;
      if (size_t e = MatchInteger(src_, pos, &base); e != std::string::npos) {
        const size_t digits_start = base == 10 ? pos : pos + 2;
        unsigned __int128 v = 0;
        for (size_t k = digits_start; k < e; ++k) {
          if (src_[k] == '_') continue;
          v = v * base + static_cast<unsigned>(HexValue(src_[k]));
          if (v > static_cast<unsigned __int128>(INT64_MAX)) {
            return Error(line, absl::StrCat("integer literal ", src_.substr(pos, e - pos), " is too large"));
          }
        }
        tokens_.push_back(Token{TokenType::kInteger, src_.substr(pos, e - pos), static_cast<int64_t>(v), 0, line});
        pos = e;
        continue;
      }
      const char c = src_[pos];
      if (IsNameStart(c)) {
        size_t e = pos;
        while (e < src_.size() && IsNameChar(src_[e])) ++e;
        tokens_.push_back(Token{TokenType::kName, src_.substr(pos, e - pos), 0, 0, line});
        pos = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = pos + 1;
        while (e < src_.size() && src_[e] != c) {
          if (src_[e] == '\\') {
            if (e + 1 >= src_.size()) break;
            size_t n = 1;
            const unsigned char b = static_cast<unsigned char>(src_[e + 1]);
            if (b >= 0x80) n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
            e += 1 + n;
            continue;
          }
          ++e;
        }
        if (e >= src_.size()) return Error(line, "unterminated string literal");
        ASSIGN_OR_RETURN(auto decoded, DecodeStringLiteral(std::string_view(src_).substr(pos + 1, e - pos - 1), line));
        tokens_.push_back(Token{TokenType::kString, std::move(decoded), 0, 0, line});
        pos = e + 1;
        continue;
      }
      bool matched = false;
      for (std::string_view op : kOperators) {
        if (src_.compare(pos, op.size(), op) != 0) continue;
        if (op == "(" || op == "[" || op == "{") {
          closers.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (closers.empty()) return Error(line, absl::StrCat("unexpected '", AV(op), "'"));
          if (closers.back() != op[0]) {
            return Error(line,
                         absl::StrCat("unexpected '", AV(op), "', expected '", std::string(1, closers.back()), "'"));
          }
          closers.pop_back();
        }
        tokens_.push_back(Token{TokenType::kOperator, std::string(op), 0, 0, line});
        pos += op.size();
        matched = true;
        break;
      }
      if (!matched) {
        size_t n = 1;
        const unsigned char b = static_cast<unsigned char>(c);
        if (b >= 0x80) n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        return Error(line, absl::StrCat("unexpected character '", src_.substr(pos, n), "'"));
      }
    }
  }

  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
  bool line_starting_ = true;
};

}  // namespace

std::string LineMessage(int line, std::string_view message) {
  return absl::StrCat("chat template line ", line, ": ", AV(message));
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  if (!text::IsValidUtf8(source)) {
    return absl::InvalidArgumentError("chat template is not valid UTF-8");
  }
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).Run();
}

}  // namespace tandem::chat_template
