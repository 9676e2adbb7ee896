// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), table driven, and
// the masked form TFRecord files store (TensorFlow's crc32c::Mask).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem::common {

// Extends `crc` (the CRC-32C of earlier bytes; 0 for none) with `data`.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);
inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }
// Rotated right by 15 bits plus a constant, so that a CRC of data that
// itself holds CRCs is not degenerate.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace tandem::common
