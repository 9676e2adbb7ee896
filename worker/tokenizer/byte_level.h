// The GPT-2 byte-to-character table of byte-level BPE: every byte maps to a
// printable character (bytes 33-126, 161-172, 174-255 to themselves, the
// rest to U+0100 onwards), so any byte string is a string of vocabulary
// characters. Constant tables; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::tokenizer {

// UTF-8 of the character standing for byte b (1 or 2 bytes).
std::string_view ByteLevelChar(unsigned char b);

// Appends the byte-level characters of every byte of `bytes` to *out.
void AppendByteLevel(std::string_view bytes, std::string* out);

// The byte a character stands for, or -1 when cp is not one of the 256.
int ByteLevelByte(uint32_t cp);

}  // namespace tandem::tokenizer
