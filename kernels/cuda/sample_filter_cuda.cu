// CudaOps::sample_filtered: one block per row (sample_filter_kernel.cuh).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_filter_kernel.cuh"

namespace tandem::kernels {

void CudaOps::sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                              const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                              float* logp_raw) {
  if (rows <= 0 || v <= 0) return;
  const bool pen = f.repetition_penalty != 1.f && seen_offsets != nullptr && seen != nullptr;
  const cuda::FilterArgs a{logits,
                           v,
                           f.temperature,
                           f.top_k,
                           f.top_p,
                           f.min_p,
                           f.repetition_penalty,
                           pen ? seen_offsets : nullptr,
                           pen ? seen : nullptr,
                           uniforms,
                           ids,
                           logp_sample,
                           logp_raw};
  // The seen-id bitmap: (V + 31) / 32 words of dynamic shared memory.
  const size_t smem = pen ? static_cast<size_t>((v + 31) / 32) * sizeof(uint32_t) : 0;
  if (smem > 48 * 1024) {
    Check(cudaFuncSetAttribute(cuda::SampleFilterKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "sample_filtered shared memory");
  }
  cuda::SampleFilterKernel<<<rows, cuda::kFilterThreads, smem>>>(a);
  Check(cudaGetLastError(), "sample_filtered");
}

}  // namespace tandem::kernels
