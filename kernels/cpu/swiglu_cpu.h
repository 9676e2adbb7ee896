// Fast CPU SwiGLU: h = silu(gate) * up and its backward, elementwise over n
// values; OpenMP over blocks, AVX2 with the Exp8 sigmoid of simd_math.h.
#pragma once

#include <cstddef>

namespace tandem::kernels::cpu {

void swiglu_forward(const float* gate, const float* up, size_t n, float* h);
void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate, float* dup);

}  // namespace tandem::kernels::cpu
