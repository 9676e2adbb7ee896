#include "worker/rollout/paged_decoder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "worker/rollout/linear_runs.h"

namespace tandem::rollout {

PagedDecoder::PagedDecoder(const model::ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory)
    : decoder_(config, ops, memory), ops_(ops) {}

absl::Status PagedDecoder::Reserve(int rows, int outs, int positions) {
  const model::DecoderDims& d = decoder_.dims();
  kernels::DeviceMemory* mem = decoder_.memory();
  rows = std::max(rows, outs);  // the wanted rows are gathered into xn_
  if (rows > rows_cap_) {
    const size_t r = rows;
    const bool qk_norm = decoder_.config().HasQkNorm();
    const std::pair<kernels::DeviceArray<float>*, int> buffers[] = {{&x_, d.C},
                                                                    {&xn_, d.C},
                                                                    {&q_, d.HD},
                                                                    {&k_, d.KD},
                                                                    {&v_, d.KD},
                                                                    {&attn_, d.HD},
                                                                    {&rstd_, d.H},
                                                                    {&gate_, d.I},
                                                                    {&up_, d.I},
                                                                    {&h_, d.I},
                                                                    {&qraw_, qk_norm ? d.HD : 0},
                                                                    {&kraw_, qk_norm ? d.KD : 0}};
    bool ok = true;
    size_t bytes = 0;
    for (const auto& [a, width] : buffers) {
      ok = ok && a->Allocate(mem, r * static_cast<size_t>(width));
      bytes += r * width * sizeof(float);
    }
    if (!ok) {
      Release();
      return absl::ResourceExhaustedError(absl::StrCat("rollout: cannot allocate ", bytes, " bytes of activations in ",
                                                       mem->name(), " memory; lower rollout.max_batch_tokens"));
    }
    rows_cap_ = rows;
  }
  if (outs > out_cap_) {
    // A step has at most one run per running sequence, and at most `outs`
    // sequences run.
    const size_t state = decoder_.has_linear_layers() ? linear_state_floats() : 0;
    if (!hn_.Allocate(mem, static_cast<size_t>(outs) * d.C) ||
        !logits_.Allocate(mem, static_cast<size_t>(outs) * d.V) || !state_.Allocate(mem, outs * state)) {
      Release();
      return absl::ResourceExhaustedError(absl::StrCat("rollout: cannot allocate logits for ", outs, " rows in ",
                                                       mem->name(), " memory; lower rollout.max_seqs"));
    }
    out_cap_ = outs;
  }
  if (absl::Status st = decoder_.EnsureRope(positions); !st.ok()) {
    Release();
    return st;
  }
  if (absl::Status st = decoder_.EnsureLinearDecay(rows_cap_); !st.ok()) {
    Release();
    return st;
  }
  return decoder_.MemoryStatus("rollout");
}

size_t PagedDecoder::linear_state_floats() const {
  const model::DecoderDims& d = decoder_.dims();
  return static_cast<size_t>(d.H) * d.D * d.D;
}

void PagedDecoder::Release() {
  for (auto* a :
       {&x_, &xn_, &q_, &qraw_, &k_, &kraw_, &v_, &attn_, &rstd_, &gate_, &up_, &h_, &hn_, &logits_, &state_}) {
    a->reset();
  }
  rows_cap_ = out_cap_ = 0;
  decoder_.ReleaseRope();
}

size_t PagedDecoder::scratch_bytes() const {
  size_t n = 0;
  for (const auto* a :
       {&x_, &xn_, &q_, &qraw_, &k_, &kraw_, &v_, &attn_, &rstd_, &gate_, &up_, &h_, &hn_, &logits_, &state_}) {
    n += a->bytes();
  }
  return n + decoder_.rope_bytes();
}

void PagedDecoder::Layer(const float* P, int l, KvPool& kv, const ForwardBatch& b) {
  const model::DecoderDims& d = decoder_.dims();
  const int C = d.C, H = d.H, Hkv = d.Hkv, D = d.D, HD = d.HD, KD = d.KD;
  const model::LayerOffsets& o = decoder_.layout().layer(l);
  const int T = b.rows;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  float* x = x_.data();
  ops_->rmsnorm_forward(x, P + o.input_norm, T, C, eps, xn_.data(), rstd_.data());
  const bool qk_norm = o.q_norm != SIZE_MAX;
  float* qp = qk_norm ? qraw_.data() : q_.data();
  float* kp = qk_norm ? kraw_.data() : k_.data();
  decoder_.ProjectQkv(P, o, T, xn_.data(), qp, kp, v_.data());
  if (qk_norm) {
    ops_->rmsnorm_forward(qp, P + o.q_norm, T * H, D, eps, q_.data(), rstd_.data());
    ops_->rmsnorm_forward(kp, P + o.k_norm, T * Hkv, D, eps, k_.data(), rstd_.data());
  }
  ops_->rope_apply(q_.data(), b.positions, T, H, D, decoder_.rope_cos(), decoder_.rope_sin(), false);
  ops_->rope_apply(k_.data(), b.positions, T, Hkv, D, decoder_.rope_cos(), decoder_.rope_sin(), false);
  if (decoder_.layer_type(l).kind == model::LayerKind::kLinear) {
    LinearAttention(l, kv, b);
    ops_->matmul(false, true, T, C, HD, 1.f, attn_.data(), HD, P + o.o, HD, 1.f, x, C);
    Mlp(P, o, T);
    return;
  }
  const int pool = kv.pool(l);
  const kernels::PagedKv pk = kv.Layer(l, b.tables_of(pool), b.max_blocks);
  ops_->paged_kv_write(pk, KD, k_.data(), v_.data(), b.slots_of(pool), T);
  const kernels::AttentionParams ap = decoder_.Attention(l);
  if (b.sparse != nullptr && decoder_.layer_type(l).kind == model::LayerKind::kFull && ap.window <= 0) {
    float* summaries = kv.Summaries(l);
    ops_->paged_key_summaries(ap, pk, b.slots_of(pool), T, summaries);
    ops_->paged_sparse_attention(ap, *b.sparse, pk, summaries, q_.data(), b.row_seq, b.positions, T, attn_.data());
  } else {
    ops_->paged_attention(ap, pk, q_.data(), b.row_seq, b.positions, T, attn_.data());
  }
  ops_->matmul(false, true, T, C, HD, 1.f, attn_.data(), HD, P + o.o, HD, 1.f, x, C);
  Mlp(P, o, T);
}

void PagedDecoder::Mlp(const float* P, const model::LayerOffsets& o, int T) {
  const model::DecoderDims& d = decoder_.dims();
  const int C = d.C, I = d.I;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  float* x = x_.data();
  ops_->rmsnorm_forward(x, P + o.post_norm, T, C, eps, xn_.data(), rstd_.data());
  ops_->matmul(false, true, T, I, C, 1.f, xn_.data(), C, P + o.gate, C, 0.f, gate_.data(), I);
  ops_->matmul(false, true, T, I, C, 1.f, xn_.data(), C, P + o.up, C, 0.f, up_.data(), I);
  ops_->swiglu_forward(gate_.data(), up_.data(), static_cast<size_t>(T) * I, h_.data());
  ops_->matmul(false, true, T, C, I, 1.f, h_.data(), I, P + o.down, I, 1.f, x, C);
}

void PagedDecoder::LinearAttention(int l, KvPool& kv, const ForwardBatch& b) {
  TANDEM_CHECK(b.num_chunks > 0 && static_cast<size_t>(b.num_chunks) * kv.state_floats() <= state_.size());
  TANDEM_CHECK(kv.state_floats() == linear_state_floats());
  RunLinearAttention(ops_, decoder_.memory(), decoder_.LinearAttention(), q_.data(), k_.data(), v_.data(),
                     decoder_.LinearDecay(b.rows), b.rows, RunsOf(b), kv.States(l), kv.state_floats(), state_.data(),
                     attn_.data());
}

absl::Status PagedDecoder::Forward(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b) {
  TANDEM_CHECK(b.rows > 0 && b.rows <= rows_cap_ && b.num_out <= out_cap_);
  const model::DecoderDims& d = decoder_.dims();
  const model::ParamLayout& layout = decoder_.layout();
  {
    const float* P = pp.AcquireParams(0);
    pp.Prefetch(1);
    ops_->embedding_forward(b.tokens, b.rows, P + layout.embed_offset(), d.C, x_.data());
    pp.ReleaseParams(0);
  }
  // Context rows take their given embedding in place of the token's.
  const size_t row_bytes = static_cast<size_t>(d.C) * sizeof(float);
  for (int i = 0; i < b.num_context; ++i) {
    decoder_.memory()->CopyOnDevice(x_.data() + static_cast<size_t>(b.context_rows[i]) * d.C,
                                    b.context_table + static_cast<size_t>(b.context_src[i]) * d.C, row_bytes);
  }
  for (int l = 0; l < d.L; ++l) {
    const int unit = layout.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    Layer(P, l, kv, b);
    pp.ReleaseParams(unit);
  }
  if (b.num_out > 0) {
    // Gather the wanted rows, then the final norm and the LM head.
    ops_->embedding_forward(b.out_rows, b.num_out, x_.data(), d.C, xn_.data());
    const int fu = layout.final_unit();
    const float* P = pp.AcquireParams(fu);
    if (layout.tied()) pp.Prefetch(0);
    ops_->rmsnorm_forward(xn_.data(), P + layout.final_norm_offset(), b.num_out, d.C,
                          static_cast<float>(decoder_.config().rms_norm_eps), hn_.data(), rstd_.data());
    pp.ReleaseParams(fu);
    decoder_.Logits(pp, hn_.data(), b.num_out, logits_.data());
  }
  return decoder_.MemoryStatus("rollout");
}

}  // namespace tandem::rollout
