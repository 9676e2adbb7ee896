#include "worker/tokenizer/byte_level.h"

#include <array>

#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

struct Tables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<char, 256 * 2> utf8{};  // two bytes per entry
  std::array<uint8_t, 256> utf8_len{};
  std::array<int16_t, 0x144> cp_to_byte{};

  Tables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    }
    cp_to_byte.fill(-1);
    for (int b = 0; b < 256; ++b) {
      std::string s;
      AppendUtf8(byte_to_cp[b], &s);
      utf8_len[b] = static_cast<uint8_t>(s.size());
      for (size_t k = 0; k < s.size(); ++k) utf8[2 * b + k] = s[k];
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& T() {
  static const Tables tables;
  return tables;
}

}  // namespace

std::string_view ByteLevelChar(unsigned char b) {
  const Tables& t = T();
  return std::string_view(&t.utf8[2 * b], t.utf8_len[b]);
}

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = T();
  const size_t old = out->size();
  out->resize(old + 2 * bytes.size());
  char* p = out->data() + old;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    p[0] = t.utf8[2 * b];
    p[1] = t.utf8[2 * b + 1];
    p += t.utf8_len[b];
  }
  out->resize(static_cast<size_t>(p - out->data()));
}

int ByteLevelByte(uint32_t cp) { return cp < 0x144 ? T().cp_to_byte[cp] : -1; }

}  // namespace tandem::tokenizer
