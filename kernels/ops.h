// Tandem compute ops: the one interface every backend implements.
//
// Contract shared by all backends (reference, fast CPU, CUDA):
//  * All tensors are dense, row-major fp32 unless stated; pointers are
//    device pointers of the backend (host memory for CPU backends).
//  * "Packed" token batches: T tokens of several sequences laid end to end;
//    `cu_seqlens[b]..cu_seqlens[b+1]` are the rows of sequence b
//    (cu_seqlens has num_seqs + 1 entries, cu_seqlens[0] == 0). Host memory
//    for CPU, device memory for CUDA.
//  * Attention layouts: q [T, H, D], k and v [T, Hkv, D] (Hkv divides H;
//    query head h reads kv head h / (H / Hkv)), out [T, H, D],
//    lse [T, H] (natural log of the softmax denominator of each row).
//  * Backward functions ACCUMULATE into parameter gradients (dw, dtable,
//    dW) and OVERWRITE activation gradients (dx, dq, ...) unless a comment
//    says otherwise. Gradient buffers may not alias inputs.
//  * Ops never allocate in steady state; where scratch is needed the caller
//    passes it (sizes are given by the *_scratch_floats helpers).
//  * No op throws; shape errors are caller bugs (checked with asserts in
//    the reference backend).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kernels {

// Rotary position embedding scaling, the same choices as Hugging Face's
// `rope_scaling` (rope_type): "default", "linear", "dynamic", "yarn",
// "llama3".
enum class RopeType { kDefault, kLinear, kDynamicNtk, kYarn, kLlama3 };

struct RopeConfig {
  int head_dim = 64;       // D (rotary applied to all D dims, rotate_half layout)
  double theta = 10000.0;  // rope_theta
  RopeType type = RopeType::kDefault;
  double factor = 1.0;               // scaling factor (linear, dynamic, yarn, llama3)
  int original_max_position = 2048;  // original_max_position_embeddings (yarn,
                                     // llama3; dynamic: max_position_embeddings)
  double beta_fast = 32.0;           // yarn
  double beta_slow = 1.0;            // yarn
  double attention_factor = 0;       // yarn mscale; 0 = HF default 0.1*ln(factor)+1
  double low_freq_factor = 1.0;      // llama3: wavelengths above
                                     // original_max_position / low_freq_factor
                                     // are divided by factor
  double high_freq_factor = 4.0;     // llama3: wavelengths below
                                     // original_max_position / high_freq_factor
                                     // are kept; in between, interpolated
};

// Fills inv_freq[D/2] and the attention scaling (multiplier of cos and sin)
// exactly as Hugging Face's ROPE_INIT_FUNCTIONS do. `seq_len` only matters
// for kDynamicNtk (HF recomputes the base when seq_len > original max).
void rope_inv_freq(const RopeConfig& cfg, int seq_len, float* inv_freq, float* attention_scaling);

// Builds cos/sin tables [max_pos, D/2] (already multiplied by the attention
// scaling) for positions 0..max_pos-1. Host helper used by every backend.
void rope_tables(const RopeConfig& cfg, int seq_len, int max_pos, float* cos, float* sin);

// Filters of Ops::sample_filtered (each off at its default).
struct SampleFilter {
  float temperature = 1.f;         // <= 0: greedy
  int top_k = 0;                   // 0 or >= V: off
  float top_p = 1.f;               // (0, 1]; 1: off
  float min_p = 0.f;               // [0, 1); 0: off
  float repetition_penalty = 1.f;  // > 0; 1: off
};

// Attention options.
struct AttentionParams {
  int num_heads = 1;     // H
  int num_kv_heads = 1;  // Hkv
  int head_dim = 64;     // D
  bool causal = true;
  int window = -1;    // sliding window: key j visible from query i when
                      // i - window < j <= i; -1 = unlimited
  int sinks = 0;      // attention sinks (causal, windowed): keys j < sinks
                      // stay visible (j <= i) outside the window too
  float scale = 0.f;  // 0 = 1/sqrt(D)
  // attention_forward/backward: rows [0, skip_query_rows) of the batch
  // (inside its first sequence) are keys only, e.g. the earlier rows of a
  // sequence-parallel rank's first sequence. Their queries are not read
  // for anything visible: their out, lse and dq are unspecified, and they
  // add nothing to dK/dV (as rows with a zero output gradient would, which
  // the caller must give them). Kernels may skip whole tiles of them.
  int skip_query_rows = 0;
};

// Storage of a paged KV cache.
enum class KvDtype { kF32, kBF16 };

// One layer of a paged KV cache: k and v pools [num_blocks, block_size, Hkv,
// D] of fp32 values or bf16 bit patterns (kernels/bf16.h). Position j of
// sequence s lives in block block_tables[s * max_blocks + j / block_size],
// row j % block_size; a block may appear in several tables (shared
// prefixes). block_tables are host (CPU) / device (CUDA) memory.
struct PagedKv {
  void* k = nullptr;
  void* v = nullptr;
  KvDtype dtype = KvDtype::kF32;
  int block_size = 16;
  int num_blocks = 0;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks]
  int max_blocks = 0;
};

// Linear attention with decay (the RetNet / GLA / CHELA family), options.
struct LinearAttentionParams {
  int num_heads = 1;   // H: q, k [T, H, Dk]; v, out [T, H, Dv]
  int key_dim = 64;    // Dk
  int value_dim = 64;  // Dv
  float scale = 0.f;   // 0 = 1/sqrt(Dk)
};

// Top-k block-sparse decode attention (HiP / Quest style), options.
struct SparseDecodeParams {
  int block_size = 64;    // cache rows per key block
  int top_k_blocks = 8;   // blocks chosen by their score bound
  int sink_blocks = 1;    // first blocks, always attended
  int recent_blocks = 2;  // last blocks (the current one included), always
};

// The op interface. One instance per backend; stateless apart from
// configuration (thread count, streams, library handles), so one instance
// may be shared by the threads of one worker only if the backend says so.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* name() const = 0;

  // C[M,N] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose
  // when the flag is set. lda/ldb/ldc are row strides of the stored arrays.
  virtual void matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                      const float* b, int ldb, float beta, float* c, int ldc) = 0;

  // out[t, :] = table[ids[t], :], table [V, C]. ids host (CPU) / device (CUDA).
  virtual void embedding_forward(const int32_t* ids, int t, const float* table, int c, float* out) = 0;
  // dtable[ids[t], :] += dout[t, :]
  virtual void embedding_backward(const int32_t* ids, int t, const float* dout, int c, float* dtable) = 0;

  // y = x * rstd * w, rstd[t] = 1/sqrt(mean(x[t]^2) + eps). x, y [T, C].
  virtual void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) = 0;
  // dx overwritten, dw accumulated.
  virtual void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c,
                                float* dx, float* dw) = 0;

  // h = silu(gate) * up, all [T, I] (n = T*I elements).
  virtual void swiglu_forward(const float* gate, const float* up, size_t n, float* h) = 0;
  virtual void swiglu_backward(const float* dh, const float* gate, const float* up, size_t n, float* dgate,
                               float* dup) = 0;

  // y += x (n elements).
  virtual void add_inplace(float* y, const float* x, size_t n) = 0;
  // y += bias broadcast over rows: y [rows, cols], bias [cols].
  virtual void add_bias(float* y, const float* bias, int rows, int cols) = 0;
  // dbias[c] += sum_r dy[r, c]
  virtual void bias_backward(const float* dy, int rows, int cols, float* dbias) = 0;

  // Rotary embedding applied in place to x [T, nh, D] (rotate_half layout,
  // as HF's apply_rotary_pos_emb), position of row t = positions[t];
  // cos/sin tables [*, D/2] from rope_tables(). `inverse` applies the
  // transpose rotation (the backward pass).
  virtual void rope_apply(float* x, const int32_t* positions, int t, int nh, int d, const float* cos, const float* sin,
                          bool inverse) = 0;

  // FlashAttention-2 style causal/varlen attention. Saves only lse [T, H].
  virtual void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                 const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) = 0;
  // Recomputes probabilities from q, k, lse. dq, dk, dv overwritten.
  virtual void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v,
                                  const float* out, const float* dout, const float* lse, const int32_t* cu_seqlens,
                                  int num_seqs, int t, float* dq, float* dk, float* dv) = 0;

  // Decode attention over a KV cache. For each of `batch` sequences:
  // q [batch, n_new, H, D]; cache k/v [batch, cache_capacity, Hkv, D];
  // cache_len[b] = tokens in the cache INCLUDING the n_new new ones, whose
  // positions are cache_len[b]-n_new .. cache_len[b]-1 (causal among them).
  // out [batch, n_new, H, D].
  virtual void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                                const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) = 0;

  // Writes k and v rows [t, kd] (kd = Hkv * D) into the pools at slots[r]
  // = block * block_size + row (rounded to bf16 for a bf16 pool, as
  // float_to_bf16). Slots are distinct.
  virtual void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots,
                              int t) = 0;
  // Attention of t query rows over a paged cache (decode steps and prefill
  // chunks alike): row r of q [t, H, D] belongs to sequence row_seq[r] at
  // position row_pos[r] and sees that sequence's positions j <= row_pos[r]
  // (and > row_pos[r] - window when windowed, or < p.sinks); p.causal is
  // implied. Every visible position must be written (the row's own k/v
  // included).
  // out [t, H, D].
  virtual void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                               const int32_t* row_pos, int t, float* out) = 0;
  // Key block summaries for sparse decode: for each batch row b, block i
  // (rows [i B, (i+1) B) of the cache that are < cache_len[b]) and kv head,
  // the elementwise max and min of its keys: summaries
  // [batch, ceil(cache_capacity / B), Hkv, 2, D] (max then min). Blocks
  // before first_block are left as they are (only the last block changes
  // per decode step); blocks with no rows are not written.
  virtual void key_block_summaries(const AttentionParams& p, int batch, const float* k_cache, int cache_capacity,
                                   const int32_t* cache_len, int block_size, int first_block, float* summaries) = 0;
  // Sparse decode attention, one new token per batch row (the last of its
  // cache_len[b] rows; p.window is ignored): for each query head, the
  // blocks attended are the sink blocks, the recent blocks and the
  // top_k_blocks other blocks with the largest bound
  // sum_d max(q_d max_d, q_d min_d) (ties: lower block first); exact softmax
  // attention over the rows of those blocks. With few enough blocks it
  // equals decode_attention. q, out [batch, H, D]; cache as decode_attention.
  virtual void sparse_decode_attention(const AttentionParams& p, const SparseDecodeParams& s, const float* q, int batch,
                                       const float* k_cache, const float* v_cache, int cache_capacity,
                                       const int32_t* cache_len, const float* summaries, float* out) = 0;
  // Key page summaries of a paged cache, for paged_sparse_attention: rows
  // r = 0..t-1 in order, each at cache slot slots[r] (page slots[r] /
  // block_size, offset j = slots[r] % block_size, already written by
  // paged_kv_write): the page's per-kv-head elementwise max and min become
  // those of its keys at offsets 0..j as stored (bf16 pools: rounded), so
  // rows past j (a copy-on-write page's rows of another sequence) never
  // count. summaries [num_blocks, Hkv, 2, D] (max then min).
  virtual void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                                   float* summaries) = 0;
  // Top-k block-sparse attention over a paged cache, rows as paged_attention
  // (no window: p.window <= 0). The sparse blocks of a sequence are s.block_size
  // consecutive positions (a multiple of kv.block_size: that many pages,
  // whose summaries combine into the block's max and min). Row r at position
  // pos sees the blocks of positions 0..pos and attends exactly, per query
  // head, to the sink blocks, the recent blocks (s.recent_blocks >= 1: the
  // row's own block is always one) and the top_k_blocks others with the
  // largest bound, the rule of sparse_decode_attention; positions > pos are
  // never attended. With few enough blocks it equals paged_attention.
  virtual void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                                      const float* summaries, const float* q, const int32_t* row_seq,
                                      const int32_t* row_pos, int t, float* out) = 0;

  // Linear attention with decay, per sequence and head, state S [Dk, Dv]:
  //   S_t = exp(g_t) S_{t-1} + k_t^T v_t,   out_t = scale * q_t S_t
  // g = log_decay [T, H] (log of the decay, <= 0 in practice; a constant per
  // head gives RetNet, a data-dependent gate GLA; nullptr = no decay).
  // Packed varlen as attention (cu_seqlens); each sequence starts from
  // initial_state[b] ([num_seqs, H, Dk, Dv]; nullptr = zeros) and, when
  // final_state != nullptr, leaves its last state there (final_state may
  // alias initial_state: one call with a few tokens per sequence is a decode
  // step that keeps only this state). Backends compute it in chunks
  // (intra-chunk matmuls plus an inter-chunk state recurrence); the result
  // equals the recurrence.
  virtual void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                        const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                                        const float* initial_state, float* out, float* final_state) = 0;
  // Gradients of the forward's out (dout) and final state (d_final_state,
  // nullptr = 0): dq, dk, dv overwritten; d_log_decay [T, H] (skipped when
  // nullptr or log_decay is nullptr) and d_initial_state (skipped when
  // nullptr) overwritten. Recomputes the states from the inputs.
  virtual void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                         const float* log_decay, const int32_t* cu_seqlens, int num_seqs, int t,
                                         const float* initial_state, const float* dout, const float* d_final_state,
                                         float* dq, float* dk, float* dv, float* d_log_decay,
                                         float* d_initial_state) = 0;

  // Fused LM head + log-softmax, chunked over tokens so at most
  // `chunk_tokens` x V logits exist at once. h [T, C], w [V, C] (logits =
  // h w^T). Writes logp[t] = log softmax(logits[t])[targets[t]] and, when
  // `entropy` != nullptr, the entropy of row t. Scratch: chunk_tokens * V.
  virtual void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v,
                                        int chunk_tokens, float* scratch, float* logp, float* entropy) = 0;
  // Given dlogp[t] (gradient of the loss w.r.t. logp[t]; 0 = token not
  // trained), recomputes each chunk's softmax and writes dh [T, C]
  // (overwritten) and accumulates dw [V, C]. Cross-entropy with a loss mask
  // is dlogp[t] = -mask[t] / num_trained_tokens.
  virtual void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp,
                                         int t, int c, int v, int chunk_tokens, float* scratch, float* dh,
                                         float* dw) = 0;
  // Greedy/sampling helper for generation: logits [rows, V] = h w^T.
  // (A plain matmul; kept separate so backends can fuse later.)

  // Sum of squares of g (n elements), accumulated in double.
  virtual double sum_squares(const float* g, size_t n) = 0;
  // x *= s
  virtual void scale(float* x, float s, size_t n) = 0;

  // One AdamW step (decoupled weight decay, bias correction) for n
  // elements. step is 1-based. p -= lr * (mhat/(sqrt(vhat)+eps) + wd * p).
  virtual void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, int64_t step) = 0;

  // Token sampling over logits [rows, V] (kernels/sample_row.h states the
  // exact rule): temperature <= 0 is greedy (argmax, lowest id on ties);
  // otherwise token = inverse CDF of softmax(logits / temperature) in
  // vocabulary order at uniforms[r] in [0, 1) (filters: sample_filtered).
  // Writes ids[r], logp_sample[r] (the
  // token's log-prob under the sampling distribution; 0 when greedy) and
  // logp_raw[r] (log softmax(logits)[id] at temperature 1). Lets generation
  // download 3 values per row instead of V logits.
  virtual void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms,
                             int32_t* ids, float* logp_sample, float* logp_raw) = 0;

  // Token sampling with filters over logits [rows, V] (kernels/
  // sample_filter_row.h states the exact rule): repetition penalty on the
  // tokens seen[seen_offsets[r] .. seen_offsets[r + 1]) of row r (ids
  // outside [0, V) ignored; both arrays may be null when the penalty is 1)
  // -> temperature (<= 0: greedy) -> top-k -> top-p -> min-p -> inverse CDF
  // at uniforms[r] in descending logit order (ties: lowest id first).
  // Writes ids[r], logp_sample[r] (log-prob under the filtered sampling
  // distribution; 0 when greedy) and logp_raw[r] (log softmax(logits)[id]
  // at temperature 1, without the penalty).
  virtual void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                               const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                               float* logp_raw) = 0;

  // bf16 storage (mixed precision: bf16 compute copies of fp32 masters).
  // bf16 values are uint16_t bit patterns (kernels/bf16.h states the rules:
  // round to nearest even, NaN kept as NaN, Inf kept, denormals kept);
  // every backend produces the same bits. x and y must not overlap.
  // y[i] = bf16(x[i])
  virtual void float_to_bf16(const float* x, uint16_t* y, size_t n) = 0;
  // y[i] = float(x[i]) (exact)
  virtual void bf16_to_float(const uint16_t* x, float* y, size_t n) = 0;

  // Blockwise int8 weights (qwZ gathers; kernels/int8_blocks.h states the
  // format and the error bound); every backend produces the same bits for
  // finite x. Pieces are quantised on their own (blocks restart at x[0]).
  // wire[Int8WireFloats(n)] = Q(x[0..n)), padding included, rounded as
  // kernels/int8_rounding.h states: to nearest for seed kInt8RoundNearest,
  // else stochastically (unbiased) with draws that depend on (seed, i) only.
  // x and wire may not overlap.
  virtual void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) = 0;
  // out[0..n) = DQ(wire). out and wire may not overlap.
  virtual void dequantize_int8(const float* wire, size_t n, float* out) = 0;
};

}  // namespace tandem::kernels
