// Fast CPU fp32 <-> bf16 conversion (kernels/bf16.h rules, bit-identical to
// the reference backend). OpenMP over blocks, SIMD-friendly branch-free
// inner loops.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cpu {

void float_to_bf16(const float* x, uint16_t* y, size_t n);
void bf16_to_float(const uint16_t* x, float* y, size_t n);

}  // namespace tandem::kernels::cpu
