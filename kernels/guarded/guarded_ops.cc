// MakeGuardedOps: see guarded_memory.h. Every pointer argument is translated
// with the extent the op reads or writes (shape-derived), so an op handed a
// host pointer, a freed buffer or a too-small buffer aborts with the
// argument's name instead of touching memory it should not.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "kernels/guarded/guarded_memory.h"
#include "kernels/int8_blocks.h"

namespace tandem::kernels {
namespace {

class GuardedOps final : public Ops {
 public:
  // CUDA ops are one instance per thread (a cuBLAS handle, one error
  // state): two threads inside the same instance at once is a bug the GPU
  // would show as a race, so the guarded backend stops on it.
  struct Exclusive {
    Exclusive(GuardedOps* ops, const char* op) : ops_(ops) {
      if (ops_->active_.fetch_add(1) != 0) {
        std::fprintf(stderr,
                     "guarded: %s: %s entered by two threads at once (an Ops "
                     "instance serves one thread at a time; give each thread "
                     "its own)\n",
                     op, ops_->name());
        std::abort();
      }
    }
    ~Exclusive() { ops_->active_.fetch_sub(1); }
    GuardedOps* ops_;
  };

  GuardedOps(std::unique_ptr<Ops> inner, GuardedMemory* memory)
      : inner_(std::move(inner)), mem_(memory), name_(std::string("guarded(") + inner_->name() + ")") {}

  const char* name() const override { return name_.c_str(); }

  void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
              int ldb, float beta, float* c, int ldc) override {
    Exclusive excl(this, "matmul");
    const size_t a_n = Strided(trans_a ? k : m, trans_a ? m : k, lda);
    const size_t b_n = Strided(trans_b ? n : k, trans_b ? k : n, ldb);
    inner_->matmul(trans_a, trans_b, m, n, k, alpha, F(a, a_n, "matmul a"), lda, F(b, b_n, "matmul b"), ldb, beta,
                   F(c, Strided(m, n, ldc), "matmul c"), ldc);
  }

  void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) override {
    Exclusive excl(this, "embedding_forward");
    const int32_t* r_ids = I(ids, t, "embedding_forward ids");
    inner_->embedding_forward(r_ids, t, F(table, Rows(r_ids, t) * c, "embedding_forward table"), c,
                              F(out, N(t) * c, "embedding_forward out"));
  }

  void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) override {
    Exclusive excl(this, "embedding_backward");
    const int32_t* r_ids = I(ids, t, "embedding_backward ids");
    inner_->embedding_backward(r_ids, t, F(dout, N(t) * c, "embedding_backward dout"), c,
                               F(dtable, Rows(r_ids, t) * c, "embedding_backward dtable"));
  }

  void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) override {
    Exclusive excl(this, "rmsnorm_forward");
    const size_t tc = N(t) * N(c);
    inner_->rmsnorm_forward(F(x, tc, "rmsnorm_forward x"), F(w, N(c), "rmsnorm_forward w"), t, c, eps,
                            F(y, tc, "rmsnorm_forward y"), F(rstd, N(t), "rmsnorm_forward rstd"));
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                        float* dw) override {
    Exclusive excl(this, "rmsnorm_backward");
    const size_t tc = N(t) * N(c);
    inner_->rmsnorm_backward(F(dy, tc, "rmsnorm_backward dy"), F(x, tc, "rmsnorm_backward x"),
                             F(w, N(c), "rmsnorm_backward w"), F(rstd, N(t), "rmsnorm_backward rstd"), t, c,
                             F(dx, tc, "rmsnorm_backward dx"), F(dw, N(c), "rmsnorm_backward dw"));
  }

  void swiglu_forward(const float* gate, const float* up, size_t n, float* h) override {
    Exclusive excl(this, "swiglu_forward");
    inner_->swiglu_forward(F(gate, n, "swiglu_forward gate"), F(up, n, "swiglu_forward up"), n,
                           F(h, n, "swiglu_forward h"));
  }

  void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate,
                       float* dup) override {
    Exclusive excl(this, "swiglu_backward");
    inner_->swiglu_backward(F(dh, n, "swiglu_backward dh"), F(gate, n, "swiglu_backward gate"),
                            F(up, n, "swiglu_backward up"), n, F(dgate, n, "swiglu_backward dgate"),
                            F(dup, n, "swiglu_backward dup"));
  }

  void add_inplace(float* y, const float* x, size_t n) override {
    Exclusive excl(this, "add_inplace");
    inner_->add_inplace(F(y, n, "add_inplace y"), F(x, n, "add_inplace x"), n);
  }

  void add_bias(float* y, const float* bias, int rows, int cols) override {
    Exclusive excl(this, "add_bias");
    inner_->add_bias(F(y, N(rows) * N(cols), "add_bias y"), F(bias, N(cols), "add_bias bias"), rows, cols);
  }

  void bias_backward(const float* dy, int rows, int cols, float* dbias) override {
    Exclusive excl(this, "bias_backward");
    inner_->bias_backward(F(dy, N(rows) * N(cols), "bias_backward dy"), rows, cols,
                          F(dbias, N(cols), "bias_backward dbias"));
  }

  void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                  bool inverse) override {
    Exclusive excl(this, "rope_apply");
    const int32_t* r_pos = I(positions, t, "rope_apply positions");
    const size_t table = Rows(r_pos, t) * N(d / 2);
    inner_->rope_apply(F(x, N(t) * N(nh) * N(d), "rope_apply x"), r_pos, t, nh, d, F(cos, table, "rope_apply cos"),
                       F(sin, table, "rope_apply sin"), inverse);
  }

  void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                         const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) override {
    Exclusive excl(this, "attention_forward");
    const size_t qn = N(t) * N(p.num_heads) * N(p.head_dim);
    const size_t kn = N(t) * N(p.num_kv_heads) * N(p.head_dim);
    inner_->attention_forward(
        p, F(q, qn, "attention_forward q"), F(k, kn, "attention_forward k"), F(v, kn, "attention_forward v"),
        I(cu_seqlens, N(num_seqs) + 1, "attention_forward cu_seqlens"), num_seqs, t,
        F(out, qn, "attention_forward out"), F(lse, N(t) * N(p.num_heads), "attention_forward lse"));
  }

  void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                          const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t,
                          float* dq, float* dk, float* dv) override {
    Exclusive excl(this, "attention_backward");
    const size_t qn = N(t) * N(p.num_heads) * N(p.head_dim);
    const size_t kn = N(t) * N(p.num_kv_heads) * N(p.head_dim);
    inner_->attention_backward(
        p, F(q, qn, "attention_backward q"), F(k, kn, "attention_backward k"), F(v, kn, "attention_backward v"),
        F(out, qn, "attention_backward out"), F(dout, qn, "attention_backward dout"),
        F(lse, N(t) * N(p.num_heads), "attention_backward lse"),
        I(cu_seqlens, N(num_seqs) + 1, "attention_backward cu_seqlens"), num_seqs, t,
        F(dq, qn, "attention_backward dq"), F(dk, kn, "attention_backward dk"), F(dv, kn, "attention_backward dv"));
  }

  void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                        const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) override {
    Exclusive excl(this, "decode_attention");
    const size_t qn = N(batch) * N(n_new) * N(p.num_heads) * N(p.head_dim);
    const size_t kn = N(batch) * N(cache_capacity) * N(p.num_kv_heads) * N(p.head_dim);
    inner_->decode_attention(p, F(q, qn, "decode_attention q"), batch, n_new,
                             F(k_cache, kn, "decode_attention k_cache"), F(v_cache, kn, "decode_attention v_cache"),
                             cache_capacity, I(cache_len, N(batch), "decode_attention cache_len"),
                             F(out, qn, "decode_attention out"));
  }

  void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) override {
    Exclusive excl(this, "paged_kv_write");
    inner_->paged_kv_write(Pools(kv, kd, 0, "paged_kv_write"), kd, F(k, N(t) * N(kd), "paged_kv_write k"),
                           F(v, N(t) * N(kd), "paged_kv_write v"), I(slots, N(t), "paged_kv_write slots"), t);
  }

  void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                       const int32_t* row_pos, int t, float* out) override {
    Exclusive excl(this, "paged_attention");
    const size_t qn = N(t) * N(p.num_heads) * N(p.head_dim);
    const int32_t* seq = I(row_seq, N(t), "paged_attention row_seq");
    int num_seqs = 0;
    for (int r = 0; r < t; ++r) num_seqs = std::max(num_seqs, seq[r] + 1);
    inner_->paged_attention(p, Pools(kv, p.num_kv_heads * p.head_dim, num_seqs, "paged_attention"),
                            F(q, qn, "paged_attention q"), seq, I(row_pos, N(t), "paged_attention row_pos"), t,
                            F(out, qn, "paged_attention out"));
  }

  void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                int chunk_tokens, float* scratch, float* logp, float* entropy) override {
    Exclusive excl(this, "lm_head_logprobs_forward");
    inner_->lm_head_logprobs_forward(F(h, N(t) * N(c), "lm_head_forward h"), F(w, N(v) * N(c), "lm_head_forward w"),
                                     I(targets, N(t), "lm_head_forward targets"), t, c, v, chunk_tokens,
                                     F(scratch, Chunk(chunk_tokens, t) * N(v), "lm_head_forward scratch"),
                                     F(logp, N(t), "lm_head_forward logp"),
                                     F(entropy, N(t), "lm_head_forward entropy"));
  }

  void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t,
                                 int c, int v, int chunk_tokens, float* scratch, float* dh, float* dw) override {
    Exclusive excl(this, "lm_head_logprobs_backward");
    inner_->lm_head_logprobs_backward(
        F(h, N(t) * N(c), "lm_head_backward h"), F(w, N(v) * N(c), "lm_head_backward w"),
        I(targets, N(t), "lm_head_backward targets"), F(dlogp, N(t), "lm_head_backward dlogp"), t, c, v, chunk_tokens,
        F(scratch, Chunk(chunk_tokens, t) * N(v), "lm_head_backward scratch"),
        F(dh, N(t) * N(c), "lm_head_backward dh"), F(dw, N(v) * N(c), "lm_head_backward dw"));
  }

  void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cap, const int32_t* cache_len,
                           int bs, int first_block, float* summaries) override {
    Exclusive excl(this, "key_block_summaries");
    const size_t kn = N(batch) * N(cap) * N(p.num_kv_heads) * N(p.head_dim);
    const size_t sn = N(batch) * N(bs > 0 ? (cap + bs - 1) / bs : 0) * N(p.num_kv_heads) * 2 * N(p.head_dim);
    inner_->key_block_summaries(p, batch, F(k_cache, kn, "key_block_summaries k_cache"), cap,
                                I(cache_len, N(batch), "key_block_summaries cache_len"), bs, first_block,
                                F(summaries, sn, "key_block_summaries summaries"));
  }

  void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                               const float* k_cache, const float* v_cache, int cap, const int32_t* cache_len,
                               const float* summaries, float* out) override {
    Exclusive excl(this, "sparse_decode_attention");
    const size_t qn = N(batch) * N(p.num_heads) * N(p.head_dim);
    const size_t kn = N(batch) * N(cap) * N(p.num_kv_heads) * N(p.head_dim);
    const int bs = s.block_size;
    const size_t sn = N(batch) * N(bs > 0 ? (cap + bs - 1) / bs : 0) * N(p.num_kv_heads) * 2 * N(p.head_dim);
    inner_->sparse_decode_attention(p, s, F(q, qn, "sparse_decode q"), batch, F(k_cache, kn, "sparse_decode k_cache"),
                                    F(v_cache, kn, "sparse_decode v_cache"), cap,
                                    I(cache_len, N(batch), "sparse_decode cache_len"),
                                    F(summaries, sn, "sparse_decode summaries"), F(out, qn, "sparse_decode out"));
  }

  void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                           float* summaries) override {
    Exclusive excl(this, "paged_key_summaries");
    const size_t sn = N(kv.num_blocks) * N(p.num_kv_heads) * 2 * N(p.head_dim);
    inner_->paged_key_summaries(p, Pools(kv, p.num_kv_heads * p.head_dim, 0, "paged_key_summaries"),
                                I(slots, N(t), "paged_key_summaries slots"), t,
                                F(summaries, sn, "paged_key_summaries summaries"));
  }

  void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                              const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                              int t, float* out) override {
    Exclusive excl(this, "paged_sparse_attention");
    const size_t qn = N(t) * N(p.num_heads) * N(p.head_dim);
    const size_t sn = N(kv.num_blocks) * N(p.num_kv_heads) * 2 * N(p.head_dim);
    const int32_t* seq = I(row_seq, N(t), "paged_sparse_attention row_seq");
    int num_seqs = 0;
    for (int r = 0; r < t; ++r) num_seqs = std::max(num_seqs, seq[r] + 1);
    inner_->paged_sparse_attention(
        p, s, Pools(kv, p.num_kv_heads * p.head_dim, num_seqs, "paged_sparse_attention"),
        F(summaries, sn, "paged_sparse_attention summaries"), F(q, qn, "paged_sparse_attention q"), seq,
        I(row_pos, N(t), "paged_sparse_attention row_pos"), t, F(out, qn, "paged_sparse_attention out"));
  }

  void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                const float* initial_state, float* out, float* final_state) override {
    Exclusive excl(this, "linear_attention_forward");
    const size_t rows = N(t) * N(p.num_heads);
    const size_t qn = rows * N(p.key_dim), vn = rows * N(p.value_dim);
    const size_t sn = N(num_seqs) * N(p.num_heads) * N(p.key_dim) * N(p.value_dim);
    inner_->linear_attention_forward(
        p, F(q, qn, "linear_attention_forward q"), F(k, qn, "linear_attention_forward k"),
        F(v, vn, "linear_attention_forward v"), F(log_decay, rows, "linear_attention_forward log_decay"),
        I(cu, N(num_seqs) + 1, "linear_attention_forward cu_seqlens"), num_seqs, t,
        F(initial_state, sn, "linear_attention_forward initial_state"), F(out, vn, "linear_attention_forward out"),
        F(final_state, sn, "linear_attention_forward final_state"));
  }

  void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                 const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                                 float* dk, float* dv, float* d_log_decay, float* d_initial_state) override {
    Exclusive excl(this, "linear_attention_backward");
    const size_t rows = N(t) * N(p.num_heads);
    const size_t qn = rows * N(p.key_dim), vn = rows * N(p.value_dim);
    const size_t sn = N(num_seqs) * N(p.num_heads) * N(p.key_dim) * N(p.value_dim);
    inner_->linear_attention_backward(
        p, F(q, qn, "linear_attention_backward q"), F(k, qn, "linear_attention_backward k"),
        F(v, vn, "linear_attention_backward v"), F(log_decay, rows, "linear_attention_backward log_decay"),
        I(cu, N(num_seqs) + 1, "linear_attention_backward cu_seqlens"), num_seqs, t,
        F(initial_state, sn, "linear_attention_backward initial_state"), F(dout, vn, "linear_attention_backward dout"),
        F(d_final_state, sn, "linear_attention_backward d_final_state"), F(dq, qn, "linear_attention_backward dq"),
        F(dk, qn, "linear_attention_backward dk"), F(dv, vn, "linear_attention_backward dv"),
        F(d_log_decay, rows, "linear_attention_backward d_log_decay"),
        F(d_initial_state, sn, "linear_attention_backward d_initial_state"));
  }

  double sum_squares(const float* g, size_t n) override {
    Exclusive excl(this, "sum_squares");
    return inner_->sum_squares(F(g, n, "sum_squares g"), n);
  }

  void scale(float* x, float s, size_t n) override {
    Exclusive excl(this, "scale");
    inner_->scale(F(x, n, "scale x"), s, n);
  }

  void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step) override {
    Exclusive excl(this, "adamw_step");
    inner_->adamw_step(F(p, n, "adamw p"), F(g, n, "adamw g"), F(m, n, "adamw m"), F(v, n, "adamw v"), n, lr, beta1,
                       beta2, eps, weight_decay, step);
  }

  void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms, int32_t* ids,
                     float* logp_sample, float* logp_raw) override {
    Exclusive excl(this, "sample_logits");
    inner_->sample_logits(
        F(logits, N(rows) * N(v), "sample_logits logits"), rows, v, temperature,
        static_cast<const double*>(mem_->Real(uniforms, N(rows) * sizeof(double), "sample_logits uniforms")),
        static_cast<int32_t*>(mem_->Real(ids, N(rows) * sizeof(int32_t), "sample_logits ids")),
        F(logp_sample, N(rows), "sample_logits logp_sample"), F(logp_raw, N(rows), "sample_logits logp_raw"));
  }

  void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                       const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                       float* logp_raw) override {
    Exclusive excl(this, "sample_filtered");
    const int32_t* off = nullptr;
    const int32_t* tokens = nullptr;
    if (seen_offsets != nullptr && seen != nullptr) {
      off = I(seen_offsets, N(rows) + 1, "sample_filtered seen_offsets");
      if (off[rows] > 0) tokens = I(seen, N(off[rows]), "sample_filtered seen");
    }
    inner_->sample_filtered(
        F(logits, N(rows) * N(v), "sample_filtered logits"), rows, v, f, off, tokens,
        static_cast<const double*>(mem_->Real(uniforms, N(rows) * sizeof(double), "sample_filtered uniforms")),
        static_cast<int32_t*>(mem_->Real(ids, N(rows) * sizeof(int32_t), "sample_filtered ids")),
        F(logp_sample, N(rows), "sample_filtered logp_sample"), F(logp_raw, N(rows), "sample_filtered logp_raw"));
  }

  void float_to_bf16(const float* x, uint16_t* y, size_t n) override {
    Exclusive excl(this, "float_to_bf16");
    inner_->float_to_bf16(F(x, n, "float_to_bf16 x"),
                          static_cast<uint16_t*>(mem_->Real(y, n * sizeof(uint16_t), "float_to_bf16 y")), n);
  }

  void bf16_to_float(const uint16_t* x, float* y, size_t n) override {
    Exclusive excl(this, "bf16_to_float");
    inner_->bf16_to_float(static_cast<const uint16_t*>(mem_->Real(x, n * sizeof(uint16_t), "bf16_to_float x")),
                          F(y, n, "bf16_to_float y"), n);
  }

  void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) override {
    Exclusive excl(this, "quantize_int8");
    inner_->quantize_int8(F(x, n, "quantize_int8 x"), n, F(wire, Int8WireFloats(n), "quantize_int8 wire"), seed);
  }

  void dequantize_int8(const float* wire, size_t n, float* out) override {
    Exclusive excl(this, "dequantize_int8");
    inner_->dequantize_int8(F(wire, Int8WireFloats(n), "dequantize_int8 wire"), n, F(out, n, "dequantize_int8 out"));
  }

 private:
  static size_t N(int x) { return x > 0 ? static_cast<size_t>(x) : 0; }
  // The pools (and, for num_seqs > 0, the block tables) translated.
  PagedKv Pools(const PagedKv& kv, int kd, int num_seqs, const char* what) const {
    PagedKv r = kv;
    const size_t elem = kv.dtype == KvDtype::kBF16 ? sizeof(uint16_t) : sizeof(float);
    const size_t bytes = N(kv.num_blocks) * N(kv.block_size) * N(kd) * elem;
    r.k = mem_->Real(kv.k, bytes, what);
    r.v = mem_->Real(kv.v, bytes, what);
    if (num_seqs > 0) {
      r.block_tables = I(kv.block_tables, N(num_seqs) * N(kv.max_blocks), what);
    }
    return r;
  }
  // Elements of a row-major [rows, cols] array with row stride ld.
  static size_t Strided(int rows, int cols, int ld) {
    if (rows <= 0 || cols <= 0) return 0;
    return (N(rows) - 1) * N(ld) + N(cols);
  }
  // Rows of a table indexed by ids[0..t) (ids already real): max id + 1.
  static size_t Rows(const int32_t* ids, int t) {
    int32_t hi = -1;
    for (int i = 0; i < t; ++i) hi = std::max(hi, ids[i]);
    return static_cast<size_t>(hi + 1);
  }
  static size_t Chunk(int chunk_tokens, int t) { return N(std::min(std::max(1, chunk_tokens), t)); }

  float* F(float* p, size_t n, const char* what) const {
    return static_cast<float*>(mem_->Real(p, n * sizeof(float), what));
  }
  const float* F(const float* p, size_t n, const char* what) const {
    return static_cast<const float*>(mem_->Real(p, n * sizeof(float), what));
  }
  const int32_t* I(const int32_t* p, size_t n, const char* what) const {
    return static_cast<const int32_t*>(mem_->Real(p, n * sizeof(int32_t), what));
  }

  std::atomic<int> active_{0};
  std::unique_ptr<Ops> inner_;
  GuardedMemory* mem_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Ops> MakeGuardedOps(std::unique_ptr<Ops> inner, GuardedMemory* memory) {
  return std::make_unique<GuardedOps>(std::move(inner), memory);
}

}  // namespace tandem::kernels
