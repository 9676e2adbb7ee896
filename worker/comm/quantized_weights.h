// Blockwise int8 weights for stage-3 parameter gathers (ZeRO++ qwZ).
//
// Format: a piece of n floats is quantised on its own in blocks of
// kInt8Block values: one fp32 scale per block (max |x| / 127) and one signed
// 8-bit code per value, q = clamp(nearbyint(x * 127 / max |x|), -127, 127)
// (all zero codes and a zero scale for an all-zero block). On the wire, and
// in memory, a piece is Int8WireFloats(n) floats: the ceil(n / kInt8Block)
// scales, then the n codes, four to a float, the last float zero-padded.
// About 1/4 of fp32 (plus 1/64 for the scales). Dequantising gives
// x' = q * scale; |x - x'| <= scale / 2 = max |x| / 254 per block.
//
// QuantizeInt8Reference / DequantizeInt8Reference are the plain
// definitions (one element at a time); QuantizeInt8 / DequantizeInt8 are
// the fast paths (a block at a time, branch-free inner loops) and produce
// the same bits. HOST pointers; nothing is allocated; thread safe.
#pragma once

#include <cstddef>

namespace tandem::comm {

inline constexpr size_t kInt8Block = 256;

size_t Int8WireFloats(size_t n);

// wire[Int8WireFloats(n)] = Q(x[0..n)). x and wire may not overlap.
void QuantizeInt8Reference(const float* x, size_t n, float* wire);
void QuantizeInt8(const float* x, size_t n, float* wire);
// out[0..n) = DQ(wire). out and wire may not overlap.
void DequantizeInt8Reference(const float* wire, size_t n, float* out);
void DequantizeInt8(const float* wire, size_t n, float* out);

}  // namespace tandem::comm
