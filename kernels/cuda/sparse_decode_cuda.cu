// Top-k block-sparse decode attention: not implemented on CUDA; the calls
// record an error naming the op (CudaOps::last_error), so a job that asks for
// sparse decode on a GPU fails with that message instead of computing
// something else.
#include "kernels/cuda/cuda_ops.h"

namespace tandem::kernels {

void CudaOps::key_block_summaries(const AttentionParams&, int, const float*, int, const int32_t*, int, int, float*) {
  Fail("key_block_summaries", "not implemented on the cuda backend");
}

void CudaOps::sparse_decode_attention(const AttentionParams&, const SparseDecodeParams&, const float*, int,
                                      const float*, const float*, int, const int32_t*, const float*, float*) {
  Fail("sparse_decode_attention", "not implemented on the cuda backend");
}

void CudaOps::paged_key_summaries(const AttentionParams&, const PagedKv&, const int32_t*, int, float*) {
  Fail("paged_key_summaries", "not implemented on the cuda backend");
}

void CudaOps::paged_sparse_attention(const AttentionParams&, const SparseDecodeParams&, const PagedKv&, const float*,
                                     const float*, const int32_t*, const int32_t*, int, float*) {
  Fail("paged_sparse_attention", "not implemented on the cuda backend");
}

}  // namespace tandem::kernels
