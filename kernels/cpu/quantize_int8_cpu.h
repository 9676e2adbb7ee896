// Fast CPU blockwise int8 quantisation (kernels/int8_blocks.h format,
// bit-identical to kernels/ref/quantize_int8_ref.h): a block at a time,
// branch-free inner loops, on the calling thread only (ZeRO calls it on its
// communication thread, beside the compute). Host pointers; nothing
// allocated.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cpu {

void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed);
void dequantize_int8(const float* wire, size_t n, float* out);

}  // namespace tandem::kernels::cpu
