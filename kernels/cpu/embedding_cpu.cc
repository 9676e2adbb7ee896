// See embedding_cpu.h.
#include "kernels/cpu/embedding_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/backends.h"

namespace tandem::kernels::cpu {

void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) {
  const bool par = static_cast<size_t>(t) * c >= (1u << 15);
#pragma omp parallel for num_threads(CpuThreads()) if (par) schedule(static)
  for (int i = 0; i < t; ++i) {
    std::memcpy(out + static_cast<size_t>(i) * c, table + static_cast<size_t>(ids[i]) * c, sizeof(float) * c);
  }
}

void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) {
  const bool par = static_cast<size_t>(t) * c >= (1u << 15) && c >= 32;
#pragma omp parallel num_threads(CpuThreads()) if (par)
  {
    const int nth = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    // Column slice of this thread, rounded to 16 floats (one cache line).
    const int per = ((c + nth - 1) / nth + 15) / 16 * 16;
    const int c0 = std::min(c, tid * per);
    const int c1 = std::min(c, c0 + per);
    for (int i = 0; i < t; ++i) {
      float* dst = dtable + static_cast<size_t>(ids[i]) * c;
      const float* src = dout + static_cast<size_t>(i) * c;
#pragma omp simd
      for (int j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace tandem::kernels::cpu
