#include "worker/chat_template/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace tandem::chat_template::text {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

#include "worker/chat_template/unicode_tables.inc"

template <size_t N>
bool InRanges(const CodePointRange (&table)[N], char32_t c) {
  const CodePointRange* end = table + N;
  const CodePointRange* it =
      std::upper_bound(table, end, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  if (it == table) return false;
  --it;
  return c >= it->first && c <= it->last;
}

// Decodes one code point at s[*i] (valid UTF-8) and advances *i.
char32_t DecodeAt(std::string_view s, size_t* i) {
  const unsigned char b0 = static_cast<unsigned char>(s[*i]);
  if (b0 < 0x80) {
    *i += 1;
    return b0;
  }
  int len = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t c = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[*i + k]) & 0x3F);
  *i += len;
  return c;
}

void AppendHex(uint32_t v, int digits, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  for (int k = digits - 1; k >= 0; --k) out->push_back(kHex[(v >> (4 * k)) & 0xF]);
}

bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char AsciiUpper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    int len;
    char32_t min;
    if ((b0 & 0xE0) == 0xC0) {
      len = 2;
      min = 0x80;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3;
      min = 0x800;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4;
      min = 0x10000;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    char32_t c = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      c = (c << 6) | (b & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool IsAscii(std::string_view s) {
  for (char ch : s) {
    if (static_cast<unsigned char>(ch) >= 0x80) return false;
  }
  return true;
}

std::vector<char32_t> Decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(DecodeAt(s, &i));
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &out);
  return out;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (char ch : s) {
    if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80) ++n;
  }
  return n;
}

size_t CodePointIndex(std::string_view s, size_t byte) { return CodePointCount(s.substr(0, byte)); }

bool IsSpace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

bool IsPrintable(char32_t c) { return !InRanges(kNonPrintable, c); }

bool IsCaseSensitive(char32_t c) { return c >= 0x80 && InRanges(kCaseSensitive, c); }

std::string Strip(std::string_view s, StripSide side, const std::string* chars) {
  std::vector<char32_t> set;
  if (chars != nullptr) set = Decode(*chars);
  auto strip_it = [&](char32_t c) {
    return chars == nullptr ? IsSpace(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  std::vector<char32_t> cps = Decode(s);
  size_t b = 0, e = cps.size();
  if (side != StripSide::kRight) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (side != StripSide::kLeft) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return Encode(cps, b, e);
}

std::vector<std::string> Split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        size_t hit = s.find(*sep, pos);
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      out.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
        if (end < sep->size()) break;
        size_t hit = s.rfind(*sep, end - sep->size());
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
        end = hit;
      }
      out.emplace_back(s.substr(0, end));
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  std::vector<char32_t> cps = Decode(s);
  const size_t n = cps.size();
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < n && IsSpace(cps[i])) ++i;
      if (i == n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(Encode(cps, i, n));  // the rest keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < n && !IsSpace(cps[j])) ++j;
      out.push_back(Encode(cps, i, j));
      i = j;
    }
  } else {
    size_t i = n;
    while (true) {
      while (i > 0 && IsSpace(cps[i - 1])) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(Encode(cps, 0, i));  // the rest keeps its leading whitespace
        break;
      }
      size_t j = i;
      while (j > 0 && !IsSpace(cps[j - 1])) --j;
      out.push_back(Encode(cps, j, i));
      i = j;
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::vector<char32_t> cps = Decode(s);
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    if (!IsLineBreak(cps[i])) {
      ++i;
      continue;
    }
    size_t eol = i;
    ++i;
    if (cps[eol] == '\r' && i < cps.size() && cps[i] == '\n') ++i;
    out.push_back(Encode(cps, start, keepends ? i : eol));
    start = i;
  }
  if (start < cps.size()) out.push_back(Encode(cps, start, cps.size()));
  return out;
}

std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    size_t i = 0;
    int64_t done = 0;
    while (true) {
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      if (i >= s.size()) break;
      size_t j = i;
      DecodeAt(s, &j);
      out.append(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string ReprString(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out;
  out.push_back(quote);
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = DecodeAt(s, &i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out.append("\\t");
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c < 0x20 || c == 0x7F) {
      out.append("\\x");
      AppendHex(c, 2, &out);
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else if (c <= 0xFF) {
      out.append("\\x");
      AppendHex(c, 2, &out);
    } else if (c <= 0xFFFF) {
      out.append("\\u");
      AppendHex(c, 4, &out);
    } else {
      out.append("\\U");
      AppendHex(c, 8, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string ReprFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), std::fabs(d), std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = 0; k < e; ++k) {
    if (sci[k] != '.') digits.push_back(sci[k]);
  }
  const int exp10 = std::stoi(sci.substr(e + 1));
  const int decpt = exp10 + 1;
  std::string out = d < 0 ? "-" : "";
  if (decpt <= -4 || decpt > 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out.append(ebuf);
  } else if (decpt <= 0) {
    out.append("0.");
    out.append(static_cast<size_t>(-decpt), '0');
    out.append(digits);
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out.append(digits);
    out.append(decpt - digits.size(), '0');
    out.append(".0");
  } else {
    out.append(digits, 0, decpt);
    out.push_back('.');
    out.append(digits, decpt, std::string::npos);
  }
  return out;
}

void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const char32_t c = DecodeAt(s, &i);
    switch (c) {
      case '"':
        out->append("\\\"");
        continue;
      case '\\':
        out->append("\\\\");
        continue;
      case '\b':
        out->append("\\b");
        continue;
      case '\f':
        out->append("\\f");
        continue;
      case '\n':
        out->append("\\n");
        continue;
      case '\r':
        out->append("\\r");
        continue;
      case '\t':
        out->append("\\t");
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7E)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        out->append("\\u");
        AppendHex(0xD800 | (v >> 10), 4, out);
        out->append("\\u");
        AppendHex(0xDC00 | (v & 0x3FF), 4, out);
      } else {
        out->append("\\u");
        AppendHex(c, 4, out);
      }
    } else {
      out->append(s.substr(start, i - start));
    }
  }
  out->push_back('"');
}

absl::StatusOr<std::string> ChangeCase(std::string_view s, CaseOp op) {
  if (!IsAscii(s)) {
    size_t i = 0;
    while (i < s.size()) {
      const char32_t c = DecodeAt(s, &i);
      if (IsCaseSensitive(c)) {
        char name[16];
        std::snprintf(name, sizeof(name), "U+%04X", static_cast<unsigned>(c));
        return absl::UnimplementedError(
            absl::StrCat("changing the case of non-ASCII letters (", name, ") is not supported"));
      }
    }
  }
  std::string out(s);
  switch (op) {
    case CaseOp::kLower:
      for (char& ch : out) ch = AsciiLower(ch);
      break;
    case CaseOp::kUpper:
      for (char& ch : out) ch = AsciiUpper(ch);
      break;
    case CaseOp::kCapitalize:
      for (size_t k = 0; k < out.size(); ++k) out[k] = k == 0 ? AsciiUpper(out[k]) : AsciiLower(out[k]);
      break;
    case CaseOp::kTitleMethod: {
      bool prev_cased = false;
      for (char& ch : out) {
        const bool cased = IsAsciiAlpha(ch);
        if (cased) ch = prev_cased ? AsciiLower(ch) : AsciiUpper(ch);
        prev_cased = cased;
      }
      break;
    }
    case CaseOp::kTitleFilter: {
      // jinja2: re.split(r"([-\s({\[<]+)") then item[0].upper() + item[1:].lower().
      std::vector<char32_t> cps = Decode(s);
      auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsSpace(c); };
      out.clear();
      size_t k = 0;
      while (k < cps.size()) {
        size_t j = k;
        const bool sep = is_sep(cps[k]);
        while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
        for (size_t m = k; m < j; ++m) {
          char32_t c = cps[m];
          if (c < 0x80)
            c = static_cast<char32_t>(m == k ? AsciiUpper(static_cast<char>(c)) : AsciiLower(static_cast<char>(c)));
          AppendUtf8(c, &out);
        }
        k = j;
      }
      break;
    }
  }
  return out;
}

}  // namespace tandem::chat_template::text
