// CudaOps::sample_logits: one block per row (sample_kernel.cuh).
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/sample_kernel.cuh"

namespace tandem::kernels {

void CudaOps::sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms,
                            int32_t* ids, float* logp_sample, float* logp_raw) {
  if (rows <= 0 || v <= 0) return;
  cuda::SampleRowKernel<<<rows, cuda::kSampleThreads>>>(logits, v, temperature, uniforms, ids, logp_sample, logp_raw);
  Check(cudaGetLastError(), "sample_logits");
}

}  // namespace tandem::kernels
