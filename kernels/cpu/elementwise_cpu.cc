// See elementwise_cpu.h.
#include "kernels/cpu/elementwise_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {
namespace {
constexpr int64_t kMinParallel = 1 << 15;
}  // namespace

void add_inplace(float* y, const float* x, size_t n) {
  const int64_t nn = static_cast<int64_t>(n);
#pragma omp parallel for simd num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static)
  for (int64_t i = 0; i < nn; ++i) y[i] += x[i];
}

void scale(float* x, float s, size_t n) {
  const int64_t nn = static_cast<int64_t>(n);
#pragma omp parallel for simd num_threads(CpuThreads()) if (nn >= kMinParallel) schedule(static)
  for (int64_t i = 0; i < nn; ++i) x[i] *= s;
}

void add_bias(float* y, const float* bias, int rows, int cols) {
  const bool par = static_cast<int64_t>(rows) * cols >= kMinParallel && rows > 1;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int r = 0; r < rows; ++r) {
    float* yr = y + static_cast<int64_t>(r) * cols;
#pragma omp simd
    for (int j = 0; j < cols; ++j) yr[j] += bias[j];
  }
}

void bias_backward(const float* dy, int rows, int cols, float* dbias) {
  // Column blocks of 64 floats; each block sums all rows with SIMD over the
  // block, so reads stay row-contiguous.
  constexpr int kCols = 64;
  const int blocks = (cols + kCols - 1) / kCols;
  const bool par = static_cast<int64_t>(rows) * cols >= kMinParallel && blocks > 1;
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int b = 0; b < blocks; ++b) {
    const int c0 = b * kCols;
    const int n = std::min(kCols, cols - c0);
    float acc[kCols] = {};
    for (int r = 0; r < rows; ++r) {
      const float* row = dy + static_cast<int64_t>(r) * cols + c0;
#pragma omp simd
      for (int j = 0; j < n; ++j) acc[j] += row[j];
    }
    for (int j = 0; j < n; ++j) dbias[c0 + j] += acc[j];
  }
}

}  // namespace tandem::kernels::cpu
