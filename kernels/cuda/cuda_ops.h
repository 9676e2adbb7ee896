// CUDA backend of tandem::kernels::Ops (see kernels/ops.h for the contract).
//
//  * Every pointer is a device pointer, index arrays (ids, targets,
//    positions, cu_seqlens, cache_len) included.
//  * All work is queued on the legacy default stream (stream 0), so plain
//    cudaMemcpy by the caller is ordered with it; methods do not synchronise
//    except sum_squares (it returns a host double).
//  * Errors never throw: the first CUDA/cuBLAS error (or unsupported shape) is
//    recorded and kept; read it with last_error() / ok(), after Synchronize()
//    for errors raised by kernels while they run.
//  * Not thread-safe: one instance per thread (the cuBLAS handle and the
//    workspace are per instance). Move-only via unique_ptr.
//  * The only allocations are the cuBLAS handle, a 1-double reduction slot
//    and a workspace grown on demand (attention backward keeps
//    rowsum(dO * O) there: t * H floats), so steady state allocates nothing.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace tandem::kernels {

class CudaOps final : public Ops {
 public:
  // nullptr when no CUDA device is usable (or cuBLAS cannot start).
  static std::unique_ptr<CudaOps> Create();
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  const char* name() const override { return "cuda"; }

  // First recorded error ("" when none). Sticky until ClearError().
  const std::string& last_error() const { return error_; }
  bool ok() const { return error_.empty(); }
  void ClearError() { error_.clear(); }
  // Waits for all queued work; records any error; returns ok().
  bool Synchronize();
  // TF32 tensor-core GEMMs (off by default: exact fp32).
  void set_allow_tf32(bool allow);

  void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
              int ldb, float beta, float* c, int ldc) override;
  void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) override;
  void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) override;
  void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) override;
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                        float* dw) override;
  void swiglu_forward(const float* gate, const float* up, size_t n, float* h) override;
  void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate,
                       float* dup) override;
  void add_inplace(float* y, const float* x, size_t n) override;
  void add_bias(float* y, const float* bias, int rows, int cols) override;
  void bias_backward(const float* dy, int rows, int cols, float* dbias) override;
  void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                  bool inverse) override;
  void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                         const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) override;
  void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                          const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t,
                          float* dq, float* dk, float* dv) override;
  void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                        const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) override;
  void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) override;
  void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                       const int32_t* row_pos, int t, float* out) override;
  // Not on CUDA yet: the contiguous sparse ops record an error naming the op.
  void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                           const int32_t* cache_len, int block_size, int first_block, float* summaries) override;
  void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                               const float* k_cache, const float* v_cache, int cache_capacity, const int32_t* cache_len,
                               const float* summaries, float* out) override;
  // Paged sparse attention (sparse_decode_cuda.cu, paged_sparse_kernel.cuh).
  void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                           float* summaries) override;
  void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                              const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                              int t, float* out) override;
  void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                                const float* initial_state, float* out, float* final_state) override;
  void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                                 const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                                 float* dk, float* dv, float* d_log_decay, float* d_initial_state) override;
  void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                int chunk_tokens, float* scratch, float* logp, float* entropy) override;
  void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t,
                                 int c, int v, int chunk_tokens, float* scratch, float* dh, float* dw) override;
  double sum_squares(const float* g, size_t n) override;
  void scale(float* x, float s, size_t n) override;
  void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) override;
  void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms, int32_t* ids,
                     float* logp_sample, float* logp_raw) override;
  void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                       const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                       float* logp_raw) override;
  void float_to_bf16(const float* x, uint16_t* y, size_t n) override;
  void bf16_to_float(const uint16_t* x, float* y, size_t n) override;
  void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) override;
  void dequantize_int8(const float* wire, size_t n, float* out) override;

  // Records `err` (with `what`) if it is the first error. Returns true when
  // err == cudaSuccess.
  bool Check(cudaError_t err, const char* what);
  bool Check(cublasStatus_t st, const char* what);
  // Records a non-CUDA failure (unsupported shape...).
  void Fail(const char* what, const std::string& why);

 private:
  CudaOps() = default;
  // Device scratch of at least `floats` floats (grown, never shrunk).
  float* Workspace(size_t floats);

  cublasHandle_t cublas_ = nullptr;
  double* reduce_slot_ = nullptr;  // sum_squares accumulator (device)
  float* workspace_ = nullptr;
  size_t workspace_floats_ = 0;
  std::string error_;
};

}  // namespace tandem::kernels
