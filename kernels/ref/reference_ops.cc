// Reference backend: Ops implemented with the plain-loop templates of
// ref_math.h (T = float, double accumulators) and the reference attention of
// attention_ref.h. Slow and obviously correct; shape errors are asserted.
// Stateless, so one instance may be shared by any number of threads.
#include <cassert>
#include <memory>

#include "kernels/backends.h"
#include "kernels/bf16.h"
#include "kernels/ops.h"
#include "kernels/ref/attention_ref.h"
#include "kernels/ref/linear_attention_ref.h"
#include "kernels/ref/paged_attention_ref.h"
#include "kernels/ref/paged_sparse_ref.h"
#include "kernels/ref/quantize_int8_ref.h"
#include "kernels/ref/ref_math.h"
#include "kernels/ref/sparse_decode_ref.h"
#include "kernels/sample_filter_row.h"
#include "kernels/sample_row.h"

namespace tandem::kernels {
namespace {

class ReferenceOps final : public Ops {
 public:
  const char* name() const override { return "reference"; }

  void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
              int ldb, float beta, float* c, int ldc) override {
    assert(m >= 0 && n >= 0 && k >= 0);
    assert(lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n);
    ref::matmul<float>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) override {
    ref::embedding_forward<float>(ids, t, table, c, out);
  }
  void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) override {
    ref::embedding_backward<float>(ids, t, dout, c, dtable);
  }

  void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) override {
    assert(c > 0);
    ref::rmsnorm_forward<float>(x, w, t, c, eps, y, rstd);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                        float* dw) override {
    ref::rmsnorm_backward<float>(dy, x, w, rstd, t, c, dx, dw);
  }

  void swiglu_forward(const float* gate, const float* up, size_t n, float* h) override {
    ref::swiglu_forward<float>(gate, up, n, h);
  }
  void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate,
                       float* dup) override {
    ref::swiglu_backward<float>(dh, gate, up, n, dgate, dup);
  }

  void add_inplace(float* y, const float* x, size_t n) override { ref::add_inplace<float>(y, x, n); }
  void add_bias(float* y, const float* bias, int rows, int cols) override { ref::add_bias<float>(y, bias, rows, cols); }
  void bias_backward(const float* dy, int rows, int cols, float* dbias) override {
    ref::bias_backward<float>(dy, rows, cols, dbias);
  }

  void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                  bool inverse) override {
    assert(d % 2 == 0);
    ref::rope_apply<float>(x, positions, t, nh, d, cos, sin, inverse);
  }

  void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                         const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) override {
    ref::attention_forward(p, q, k, v, cu_seqlens, num_seqs, t, out, lse);
  }
  void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                          const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t,
                          float* dq, float* dk, float* dv) override {
    ref::attention_backward(p, q, k, v, out, dout, lse, cu_seqlens, num_seqs, t, dq, dk, dv);
  }
  void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                        const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) override {
    ref::decode_attention(p, q, batch, n_new, k_cache, v_cache, cache_capacity, cache_len, out);
  }

  void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                           const int32_t* cache_len, int block_size, int first_block, float* summaries) override {
    ref::key_block_summaries(p, batch, k_cache, cache_capacity, cache_len, block_size, first_block, summaries);
  }
  void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                               const float* k_cache, const float* v_cache, int cache_capacity, const int32_t* cache_len,
                               const float* summaries, float* out) override {
    ref::sparse_decode_attention(p, s, q, batch, k_cache, v_cache, cache_capacity, cache_len, summaries, out);
  }
  void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                           float* summaries) override {
    ref::paged_key_summaries(p, kv, slots, t, summaries);
  }
  void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                              const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                              int t, float* out) override {
    ref::paged_sparse_attention(p, s, kv, summaries, q, row_seq, row_pos, t, out);
  }

  void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                const float* initial_state, float* out, float* final_state) override {
    ref::linear_attention_forward(p, q, k, v, log_decay, cu, num_seqs, t, initial_state, out, final_state);
  }
  void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                 const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                                 float* dk, float* dv, float* d_log_decay, float* d_initial_state) override {
    ref::linear_attention_backward(p, q, k, v, log_decay, cu, num_seqs, t, initial_state, dout, d_final_state, dq, dk,
                                   dv, d_log_decay, d_initial_state);
  }

  // The reference ignores chunking (one row at a time, in double); scratch
  // is unused.
  void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) override {
    ref::paged_kv_write(kv, kd, k, v, slots, t);
  }
  void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                       const int32_t* row_pos, int t, float* out) override {
    ref::paged_attention(p, kv, q, row_seq, row_pos, t, out);
  }

  void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                int chunk_tokens, float* scratch, float* logp, float* entropy) override {
    assert(v > 0 && c > 0);
    ref::lm_head_logprobs_forward<float>(h, w, targets, t, c, v, logp, entropy);
  }
  void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t,
                                 int c, int v, int chunk_tokens, float* scratch, float* dh, float* dw) override {
    assert(v > 0 && c > 0);
    ref::lm_head_logprobs_backward<float>(h, w, targets, dlogp, t, c, v, dh, dw);
  }

  double sum_squares(const float* g, size_t n) override { return ref::sum_squares<float>(g, n); }
  void scale(float* x, float s, size_t n) override { ref::scale<float>(x, s, n); }
  void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) override {
    assert(step >= 1);
    ref::adamw_step<float>(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
  }
  void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms, int32_t* ids,
                     float* logp_sample, float* logp_raw) override {
    for (int r = 0; r < rows; ++r) {
      SampleRowAt(logits, r, v, temperature, uniforms, ids, logp_sample, logp_raw);
    }
  }
  void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                       const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                       float* logp_raw) override {
    for (int r = 0; r < rows; ++r) {
      SampleFilteredRowAt(logits, r, v, f, seen_offsets, seen, uniforms, ids, logp_sample, logp_raw, filter_scratch_);
    }
  }
  void float_to_bf16(const float* x, uint16_t* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = Bf16FromFloat(x[i]);
  }
  void bf16_to_float(const uint16_t* x, float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] = FloatFromBf16(x[i]);
  }
  void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) override {
    ref::quantize_int8(x, n, wire, seed);
  }
  void dequantize_int8(const float* wire, size_t n, float* out) override { ref::dequantize_int8(wire, n, out); }

 private:
  SampleFilterScratch filter_scratch_;
};

}  // namespace

std::unique_ptr<Ops> MakeReferenceOps() { return std::make_unique<ReferenceOps>(); }

}  // namespace tandem::kernels
