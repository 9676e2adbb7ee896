// Reference blockwise int8 quantisation (kernels/int8_blocks.h states the
// format): one element at a time, the definition every backend matches bit
// for bit. Host pointers; nothing allocated; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::ref {

// wire[Int8WireFloats(n)] = Q(x[0..n)) with the rounding of seed
// (kernels/int8_rounding.h). x and wire may not overlap.
void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed);
// out[0..n) = DQ(wire). out and wire may not overlap.
void dequantize_int8(const float* wire, size_t n, float* out);

}  // namespace tandem::kernels::ref
