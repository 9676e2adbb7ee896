// Float instantiations of the reference attention (attention_ref_math.h).
#include "kernels/ref/attention_ref.h"

#include <cassert>

#include "kernels/ref/attention_ref_math.h"

namespace tandem::kernels::ref {

void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int num_seqs, int t, float* out, float* lse) {
  assert(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0);
  assert(cu_seqlens[0] == 0 && cu_seqlens[num_seqs] <= t);
  assert(p.skip_query_rows == 0 || (num_seqs > 0 && p.skip_query_rows <= cu_seqlens[1]));
  AttentionForwardT<float>(p, q, k, v, cu_seqlens, num_seqs, out, lse);
}

void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                        const float* dout, const float* lse, const int32_t* cu_seqlens, int num_seqs, int t, float* dq,
                        float* dk, float* dv) {
  assert(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0);
  assert(cu_seqlens[0] == 0 && cu_seqlens[num_seqs] <= t);
  assert(p.skip_query_rows == 0 || (num_seqs > 0 && p.skip_query_rows <= cu_seqlens[1]));
  AttentionBackwardT<float>(p, q, k, v, out, dout, lse, cu_seqlens, num_seqs, t, dq, dk, dv);
}

void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                      const float* v_cache, int cache_capacity, const int32_t* cache_len, float* out) {
  assert(p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0);
  DecodeAttentionT<float>(p, q, batch, n_new, k_cache, v_cache, cache_capacity, cache_len, out);
}

}  // namespace tandem::kernels::ref
