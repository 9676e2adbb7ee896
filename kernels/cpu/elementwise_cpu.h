// Fast CPU elementwise ops: residual add, bias add and its gradient, scale.
// OpenMP over blocks (bias_backward: over column blocks, deterministic),
// SIMD inner loops.
#pragma once

#include <cstddef>

namespace tandem::kernels::cpu {

void add_inplace(float* y, const float* x, size_t n);
void add_bias(float* y, const float* bias, int rows, int cols);
void bias_backward(const float* dy, int rows, int cols, float* dbias);
void scale(float* x, float s, size_t n);

}  // namespace tandem::kernels::cpu
