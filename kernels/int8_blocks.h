// Blockwise int8 weights (the wire format of qwZ stage-3 gathers).
//
// A piece of n floats is quantised on its own in blocks of kInt8Block
// values: one fp32 scale per block (max |x| / 127) and one signed 8-bit code
// per value, q = clamp(round(x * (127 / max |x|)), -127, 127) (all zero
// codes and a zero scale for an all-zero block), where round is to nearest
// or stochastic (kernels/int8_rounding.h; the caller's seed decides). In
// memory and on the wire a piece is Int8WireFloats(n) floats: the
// ceil(n / kInt8Block) scales, then the n codes, four to a float, the last
// float zero-padded. About 1/4 of fp32 (plus 1/64 for the scales). Dequantising gives x' = q * scale;
// |x - x'| <= scale / 2 = max |x| / 254 per block (finite x) rounding to
// nearest, |x - x'| < scale stochastically (E[x'] = x).
//
// Ops::quantize_int8 / Ops::dequantize_int8 (kernels/ops.h) implement it on
// every backend with the same bits; kernels/ref/quantize_int8_ref.h is the
// plain definition. Header-only, usable from host and device code.
#pragma once

#include <cstddef>

namespace tandem::kernels {

inline constexpr size_t kInt8Block = 256;

constexpr size_t Int8Blocks(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

// Floats of a quantised piece of n values (scales, then the packed codes).
constexpr size_t Int8WireFloats(size_t n) { return Int8Blocks(n) + (n + 3) / 4; }

}  // namespace tandem::kernels
