// Fast CPU backend: dispatches each Ops method to its kernels/cpu/*_cpu.cc
// implementation, and owns the process-wide CPU thread setting.
//
// Threads: SetCpuThreads(n) sets both the OpenMP team size (every parallel
// region here names it with num_threads, so it holds for any calling thread)
// and OpenBLAS's pthread count. No OpenMP region calls BLAS, so at most n
// threads compute at once. A CpuOps instance holds a small growable scratch
// (rmsnorm dw partials): use one instance per calling thread.
#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <memory>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/convert_cpu.h"
#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/cpu/embedding_cpu.h"
#include "kernels/cpu/linear_attention_cpu.h"
#include "kernels/cpu/lm_head_cpu.h"
#include "kernels/cpu/matmul_cpu.h"
#include "kernels/cpu/optimizer_cpu.h"
#include "kernels/cpu/paged_attention_cpu.h"
#include "kernels/cpu/paged_sparse_cpu.h"
#include "kernels/cpu/quantize_int8_cpu.h"
#include "kernels/cpu/rmsnorm_cpu.h"
#include "kernels/cpu/rope_cpu.h"
#include "kernels/cpu/sparse_decode_cpu.h"
#include "kernels/cpu/swiglu_cpu.h"
#include "kernels/ops.h"
#include "kernels/sample_filter_row.h"
#include "kernels/sample_row.h"

namespace tandem::kernels {
namespace {

std::atomic<int> g_cpu_threads{0};

class CpuOps final : public Ops {
 public:
  const char* name() const override { return "cpu"; }

  void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
              int ldb, float beta, float* c, int ldc) override {
    cpu::matmul(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) override {
    cpu::embedding_forward(ids, t, table, c, out);
  }
  void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) override {
    cpu::embedding_backward(ids, t, dout, c, dtable);
  }

  void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) override {
    cpu::rmsnorm_forward(x, w, t, c, eps, y, rstd);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                        float* dw) override {
    const int threads = CpuThreads();
    const size_t need = static_cast<size_t>(threads) * c;
    if (scratch_.size() < need) scratch_.resize(need);  // grows once
    cpu::rmsnorm_backward(dy, x, w, rstd, t, c, dx, dw, scratch_.data(), threads);
  }

  void swiglu_forward(const float* gate, const float* up, size_t n, float* h) override {
    cpu::swiglu_forward(gate, up, n, h);
  }
  void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate,
                       float* dup) override {
    cpu::swiglu_backward(dh, gate, up, n, dgate, dup);
  }

  void add_inplace(float* y, const float* x, size_t n) override { cpu::add_inplace(y, x, n); }
  void add_bias(float* y, const float* bias, int rows, int cols) override { cpu::add_bias(y, bias, rows, cols); }
  void bias_backward(const float* dy, int rows, int cols, float* dbias) override {
    cpu::bias_backward(dy, rows, cols, dbias);
  }

  void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                  bool inverse) override {
    cpu::rope_apply(x, positions, t, nh, d, cos, sin, inverse);
  }

  void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                         const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) override {
    cpu::attention_forward(p, q, k, v, cu_seqlens, num_seqs, t, out, lse);
  }
  void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                          const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t,
                          float* dq, float* dk, float* dv) override {
    cpu::attention_backward(p, q, k, v, out, dout, lse, cu_seqlens, num_seqs, t, dq, dk, dv);
  }
  void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                        const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) override {
    cpu::decode_attention(p, q, batch, n_new, k_cache, v_cache, cache_capacity, cache_len, out);
  }

  void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) override {
    cpu::paged_kv_write(kv, kd, k, v, slots, t);
  }
  void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                       const int32_t* row_pos, int t, float* out) override {
    cpu::paged_attention(p, kv, q, row_seq, row_pos, t, out);
  }

  void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                           const int32_t* cache_len, int block_size, int first_block, float* summaries) override {
    cpu::key_block_summaries(p, batch, k_cache, cache_capacity, cache_len, block_size, first_block, summaries);
  }
  void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                               const float* k_cache, const float* v_cache, int cache_capacity, const int32_t* cache_len,
                               const float* summaries, float* out) override {
    cpu::sparse_decode_attention(p, s, q, batch, k_cache, v_cache, cache_capacity, cache_len, summaries, out);
  }
  void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                           float* summaries) override {
    cpu::paged_key_summaries(p, kv, slots, t, summaries);
  }
  void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                              const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                              int t, float* out) override {
    cpu::paged_sparse_attention(p, s, kv, summaries, q, row_seq, row_pos, t, out);
  }

  void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                const float* initial_state, float* out, float* final_state) override {
    cpu::linear_attention_forward(p, q, k, v, log_decay, cu, num_seqs, t, initial_state, out, final_state);
  }
  void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                 const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                                 float* dk, float* dv, float* d_log_decay, float* d_initial_state) override {
    cpu::linear_attention_backward(p, q, k, v, log_decay, cu, num_seqs, t, initial_state, dout, d_final_state, dq, dk,
                                   dv, d_log_decay, d_initial_state);
  }

  void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                int chunk_tokens, float* scratch, float* logp, float* entropy) override {
    cpu::lm_head_logprobs_forward(h, w, targets, t, c, v, chunk_tokens, scratch, logp, entropy);
  }
  void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t,
                                 int c, int v, int chunk_tokens, float* scratch, float* dh, float* dw) override {
    cpu::lm_head_logprobs_backward(h, w, targets, dlogp, t, c, v, chunk_tokens, scratch, dh, dw);
  }

  double sum_squares(const float* g, size_t n) override { return cpu::sum_squares(g, n); }
  void scale(float* x, float s, size_t n) override { cpu::scale(x, s, n); }
  void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) override {
    cpu::adamw_step(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
  }
  void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms, int32_t* ids,
                     float* logp_sample, float* logp_raw) override {
    // Rows are independent and each is computed exactly as the reference.
#pragma omp parallel for schedule(static) if (rows > 1 && static_cast <size_t>(rows) * v > 65536)
    for (int r = 0; r < rows; ++r) {
      SampleRowAt(logits, r, v, temperature, uniforms, ids, logp_sample, logp_raw);
    }
  }
  void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                       const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                       float* logp_raw) override {
    // Rows are independent and each is computed exactly as the reference;
    // each thread keeps its own scratch (grown once to the vocabulary).
#pragma omp parallel for schedule(dynamic) if (rows > 1)
    for (int r = 0; r < rows; ++r) {
      thread_local SampleFilterScratch scratch;
      SampleFilteredRowAt(logits, r, v, f, seen_offsets, seen, uniforms, ids, logp_sample, logp_raw, scratch);
    }
  }
  void float_to_bf16(const float* x, uint16_t* y, size_t n) override { cpu::float_to_bf16(x, y, n); }
  void bf16_to_float(const uint16_t* x, float* y, size_t n) override { cpu::bf16_to_float(x, y, n); }
  void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) override {
    cpu::quantize_int8(x, n, wire, seed);
  }
  void dequantize_int8(const float* wire, size_t n, float* out) override { cpu::dequantize_int8(wire, n, out); }

 private:
  std::vector<float> scratch_;
};

}  // namespace

void SetCpuThreads(int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  g_cpu_threads.store(num_threads);
  omp_set_num_threads(num_threads);
  // The GEMM splits across the OpenMP threads itself (matmul_cpu.h).
  openblas_set_num_threads(1);
}

int CpuThreads() {
  int n = g_cpu_threads.load(std::memory_order_relaxed);
  if (n <= 0) {
    SetCpuThreads(0);
    n = g_cpu_threads.load();
  }
  return n;
}

std::unique_ptr<Ops> MakeCpuOps(int num_threads) {
  SetCpuThreads(num_threads);
  return std::make_unique<CpuOps>();
}

}  // namespace tandem::kernels
