#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// For a lead byte, the number of bytes of its sequence and the allowed range
// of the second byte (Unicode Table 3-7); need 0 for a byte that cannot lead.
struct Lead {
  int need;
  unsigned char lo, hi;
};

Lead LeadInfo(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Bytes of s that belong to the sequence led by s[0]: the whole sequence when
// well formed (*complete = true), else the maximal invalid subpart (>= 1).
int ScanSequence(std::string_view s, bool* complete) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const Lead lead = LeadInfo(p[0]);
  *complete = false;
  if (lead.need == 0) return 1;
  if (lead.need == 1) {
    *complete = true;
    return 1;
  }
  int n = 1;
  while (n < lead.need) {
    if (static_cast<size_t>(n) >= s.size()) return n;
    const unsigned char lo = n == 1 ? lead.lo : 0x80;
    const unsigned char hi = n == 1 ? lead.hi : 0xBF;
    if (p[n] < lo || p[n] > hi) return n;
    ++n;
  }
  *complete = true;
  return n;
}

}  // namespace

int Utf8SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  bool complete;
  const int n = ScanSequence(s, &complete);
  return complete ? n : 0;
}

size_t ValidUtf8Prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w = 0;
      for (int k = 0; k < 8; ++k) w |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    bool complete;
    const int n = ScanSequence(s.substr(i), &complete);
    if (!complete) return i;
    i += n;
  }
  return s.size();
}

void AppendUtf8Lossy(std::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t valid = ValidUtf8Prefix(s.substr(i));
    out->append(s.substr(i, valid));
    i += valid;
    if (i >= s.size()) break;
    bool complete;
    i += ScanSequence(s.substr(i), &complete);
    out->append(kReplacementChar);
  }
}

uint32_t DecodeUtf8(std::string_view s, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *len = 2;
    return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if (p[0] < 0xF0) {
    *len = 3;
    return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  *len = 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsWhiteSpace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t LeadingWhiteSpace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int len;
    if (!IsWhiteSpace(DecodeUtf8(s.substr(i), &len))) break;
    i += len;
  }
  return i;
}

size_t TrailingWhiteSpace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    int len;
    if (!IsWhiteSpace(DecodeUtf8(s.substr(start), &len))) break;
    end = start;
  }
  return s.size() - end;
}

}  // namespace tandem::tokenizer
