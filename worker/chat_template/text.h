// Text helpers with Python's semantics, over UTF-8 strings: code points,
// str.isspace / isprintable / splitlines, repr() of str and float, json.dumps
// of a str, and ASCII case conversion that refuses text Python would case
// differently. Strings handed in are valid UTF-8 (the lexer and the JSON
// parser check that). Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::chat_template::text {

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs).
bool IsValidUtf8(std::string_view s);
bool IsAscii(std::string_view s);

std::vector<char32_t> Decode(std::string_view s);
void AppendUtf8(char32_t c, std::string* out);
std::string Encode(const std::vector<char32_t>& cps, size_t begin, size_t end);
size_t CodePointCount(std::string_view s);
// Code-point index of byte offset `byte` (a character boundary) in `s`.
size_t CodePointIndex(std::string_view s, size_t byte);

bool IsSpace(char32_t c);      // str.isspace
bool IsLineBreak(char32_t c);  // a boundary of str.splitlines
bool IsPrintable(char32_t c);  // str.isprintable
// A non-ASCII code point that lower/upper/title/casefold change, or that
// Python counts as cased.
bool IsCaseSensitive(char32_t c);

enum class StripSide { kBoth, kLeft, kRight };
// str.strip / lstrip / rstrip; `chars` null means whitespace.
std::string Strip(std::string_view s, StripSide side, const std::string* chars);
// str.split(sep, maxsplit) with sep given (non-empty), and str.split() (sep
// null: runs of whitespace). maxsplit < 0: no limit. `from_right`: rsplit.
std::vector<std::string> Split(std::string_view s, const std::string* sep, int64_t maxsplit, bool from_right);
// str.splitlines(keepends)
std::vector<std::string> SplitLines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0: all.
std::string Replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);

// repr(str) and repr(float) as CPython 3.11 prints them.
std::string ReprString(std::string_view s);
std::string ReprFloat(double d);
// json.dumps(str, ensure_ascii=...)
void AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out);

// str.lower / upper / capitalize / title and jinja2's `title` filter. Exact
// for ASCII letters; text holding a case-sensitive non-ASCII code point is
// refused (Unimplemented, naming the code point), never cased differently
// from Python.
enum class CaseOp { kLower, kUpper, kCapitalize, kTitleMethod, kTitleFilter };
absl::StatusOr<std::string> ChangeCase(std::string_view s, CaseOp op);

}  // namespace tandem::chat_template::text
