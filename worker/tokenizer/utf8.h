// UTF-8 helpers for the tokenizer: validation, decoding one code point,
// lossy repair (each maximal invalid subsequence becomes U+FFFD, as Rust's
// String::from_utf8_lossy, Python's errors="replace" and WHATWG do) and the
// Unicode White_Space property. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at s[0] (1-4), or 0 when
// s is empty or does not start with one.
int Utf8SequenceLength(std::string_view s);

// Number of leading bytes of s that form well-formed UTF-8.
size_t ValidUtf8Prefix(std::string_view s);
inline bool IsValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

// Appends s to *out with every maximal invalid subsequence replaced by U+FFFD.
void AppendUtf8Lossy(std::string_view s, std::string* out);

// Decodes the code point at the start of s, which must be valid UTF-8 and
// non-empty; sets *len to its byte length.
uint32_t DecodeUtf8(std::string_view s, int* len);

// Byte length of the UTF-8 sequence whose lead byte is b (1 for a stray byte).
inline int Utf8LeadLength(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

void AppendUtf8(uint32_t cp, std::string* out);

// The Unicode White_Space property (what Rust's char::is_whitespace and the
// regex crate's \s use).
bool IsWhiteSpace(uint32_t cp);

// Number of bytes of leading / trailing White_Space in s (valid UTF-8).
size_t LeadingWhiteSpace(std::string_view s);
size_t TrailingWhiteSpace(std::string_view s);

}  // namespace tandem::tokenizer
