// Fast CPU RMSNorm. OpenMP over rows, SIMD over the hidden dimension.
// Backward accumulates dw through per-thread partial rows held in
// `partial` (at least num_threads * c floats, caller-owned) and a final
// column-parallel reduction: one pass over dy and x, deterministic for a fixed
// thread count.
#pragma once

namespace tandem::kernels::cpu {

void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                      float* dw, float* partial, int num_threads);

}  // namespace tandem::kernels::cpu
