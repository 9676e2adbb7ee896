// Fast CPU optimizer helpers: fused single-pass AdamW (torch.optim.AdamW
// semantics) and the sum of squares used for global-norm clipping (double
// per-thread accumulators). OpenMP over blocks, AVX2 inner loops.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels::cpu {

double sum_squares(const float* g, size_t n);
void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, int64_t step);

}  // namespace tandem::kernels::cpu
