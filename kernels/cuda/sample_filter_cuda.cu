// CudaOps::sample_filtered: one block per row (sample_filter_kernel.cuh).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_filter_kernel.cuh"

namespace tandem::kernels {

void CudaOps::sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                              const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                              float* logp_raw) {
  if (rows <= 0 || v <= 0) return;
  const cuda::FilterArgs a =
      cuda::MakeFilterArgs(logits, v, f, seen_offsets, seen, uniforms, ids, logp_sample, logp_raw);
  const size_t smem = cuda::FilterSharedBytes(a);  // the seen-id bitmap
  if (smem > 48 * 1024) {
    Check(cudaFuncSetAttribute(cuda::SampleFilterKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "sample_filtered shared memory");
  }
  cuda::SampleFilterKernel<<<rows, cuda::kFilterThreads, smem>>>(a);
  Check(cudaGetLastError(), "sample_filtered");
}

}  // namespace tandem::kernels
