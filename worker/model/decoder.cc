#include "worker/model/decoder.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace tandem::model {

DecoderDims::DecoderDims(const ModelConfig& c)
    : C(c.hidden_size),
      H(c.num_attention_heads),
      Hkv(c.KvHeads()),
      D(c.HeadDim()),
      I(c.intermediate_size),
      V(c.vocab_size),
      L(c.num_hidden_layers),
      HD(H * D),
      KD(Hkv * D) {}

Decoder::Decoder(const ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory)
    : config_(config),
      layout_(config),
      dims_(config),
      ops_(ops),
      owned_memory_(memory == nullptr ? kernels::MakeHostMemory() : nullptr),
      mem_(memory == nullptr ? owned_memory_.get() : memory),
      eps_(static_cast<float>(config.rms_norm_eps)) {
  for (int l = 0; l < dims_.L; ++l) layer_types_.push_back(LayerTypeOf(config_, l));
}

kernels::LinearAttentionParams Decoder::LinearAttention() const {
  kernels::LinearAttentionParams p;
  p.num_heads = dims_.H;
  p.key_dim = dims_.D;
  p.value_dim = dims_.D;
  return p;
}

bool Decoder::has_linear_layers() const {
  for (const LayerType& t : layer_types_)
    if (t.kind == LayerKind::kLinear) return true;
  return false;
}

absl::Status Decoder::EnsureLinearDecay(int rows) {
  if (!has_linear_layers() || rows <= linear_decay_rows_) return absl::OkStatus();
  const int n = std::max(rows, 2 * linear_decay_rows_);
  std::vector<float> host(static_cast<size_t>(n) * dims_.H);
  for (size_t r = 0; r < host.size(); ++r) {
    host[r] = static_cast<float>(LinearLogDecay(first_head_ + static_cast<int>(r % dims_.H)));
  }
  linear_decay_rows_ = 0;
  if (!linear_decay_.Allocate(mem_, host.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("model: cannot allocate ", host.size() * sizeof(float),
                                                     " bytes of linear-attention decay in ", mem_->name(), " memory"));
  }
  linear_decay_.Upload(host.data(), host.size());
  linear_decay_rows_ = n;
  return absl::OkStatus();
}

const float* Decoder::LinearDecay(int rows) const {
  TANDEM_CHECK(rows <= linear_decay_rows_);
  return linear_decay_.data();
}

absl::Status Decoder::MemoryStatus(const char* who) const {
  if (mem_->ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(who, ": device memory (", mem_->name(), "): ", mem_->last_error()));
}

kernels::AttentionParams Decoder::Attention(int layer) const {
  kernels::AttentionParams p;
  p.num_heads = dims_.H;
  p.num_kv_heads = dims_.Hkv;
  p.head_dim = dims_.D;
  p.causal = true;
  p.window = config_.LayerWindow(layer);
  const LayerType& t = layer_types_[layer];
  if (t.kind == LayerKind::kWindow || t.kind == LayerKind::kSinkWindow) p.window = t.window;
  if (t.kind == LayerKind::kSinkWindow) p.sinks = t.sinks;
  return p;
}

absl::Status Decoder::EnsureRope(int positions) {
  const kernels::RopeConfig rc = config_.Rope();
  // Dynamic NTK: HF recomputes the base from the longest sequence once it
  // exceeds the original maximum.
  const int key = rc.type == kernels::RopeType::kDynamicNtk ? std::max(positions, rc.original_max_position) : 0;
  if (key == rope_key_ && positions <= rope_rows_) return absl::OkStatus();
  // Sized by the positions in use (grown by doubling), never by
  // max_position_embeddings: a config may declare millions of positions.
  const int rows = std::max(RopeRowsFor(positions), rope_rows_);
  const size_t n = static_cast<size_t>(rows) * dims_.D / 2;
  cos_.assign(n, 0.f);
  sin_.assign(n, 0.f);
  kernels::rope_tables(rc, key > 0 ? key : rows, rows, cos_.data(), sin_.data());
  rope_rows_ = 0;
  rope_key_ = -1;
  if (cos_d_.size() < n || sin_d_.size() < n) {
    cos_d_.reset();
    sin_d_.reset();
    if (!cos_d_.Allocate(mem_, n) || !sin_d_.Allocate(mem_, n)) {
      cos_d_.reset();
      sin_d_.reset();
      return absl::ResourceExhaustedError(absl::StrCat("model: cannot allocate ", 2 * n * sizeof(float),
                                                       " bytes of rope tables in ", mem_->name(), " memory"));
    }
  }
  cos_d_.Upload(cos_.data(), n);
  sin_d_.Upload(sin_.data(), n);
  rope_rows_ = rows;
  rope_key_ = key;
  return absl::OkStatus();
}

void Decoder::ReleaseRope() {
  cos_d_.reset();
  sin_d_.reset();
  for (auto* v : {&cos_, &sin_}) {
    v->clear();
    v->shrink_to_fit();
  }
  rope_rows_ = 0;
  rope_key_ = -1;
}

void Decoder::ProjectQkv(const float* P, const LayerOffsets& o, int rows, const float* xn, float* q, float* k,
                         float* v) const {
  const int C = dims_.C, HD = dims_.HD, KD = dims_.KD;
  ops_->matmul(false, true, rows, HD, C, 1.f, xn, C, P + o.q, C, 0.f, q, HD);
  ops_->matmul(false, true, rows, KD, C, 1.f, xn, C, P + o.k, C, 0.f, k, KD);
  if (v != nullptr) {
    ops_->matmul(false, true, rows, KD, C, 1.f, xn, C, P + o.v, C, 0.f, v, KD);
  }
  if (o.q_bias != SIZE_MAX) {
    ops_->add_bias(q, P + o.q_bias, rows, HD);
    ops_->add_bias(k, P + o.k_bias, rows, KD);
    if (v != nullptr) ops_->add_bias(v, P + o.v_bias, rows, KD);
  }
}

void Decoder::AttentionBlock(const float* P, int l, const DecoderInput& in, const DecoderActivations& a,
                             bool block) const {
  const int C = dims_.C, H = dims_.H, Hkv = dims_.Hkv, D = dims_.D;
  const int HD = dims_.HD, KD = dims_.KD;
  const LayerOffsets& o = layout_.layer(l);
  const int T = in.rows;
  const size_t TC = static_cast<size_t>(T) * C;
  const float* x = a.x.at(l);
  float* xmid = a.xmid.at(l);
  float* q = a.q.at(l);
  float* k = a.k.at(l);
  float* v = a.v.at(l);
  float* attn = a.attn.at(l);
  const kernels::AttentionParams ap = Attention(l);

  ops_->rmsnorm_forward(x, P + o.input_norm, T, C, eps_, a.xn, a.rstd_in.at(l));
  const bool qk_norm = o.q_norm != SIZE_MAX;
  float* qp = qk_norm ? a.q_raw.at(l) : q;
  float* kp = qk_norm ? a.k_raw.at(l) : k;
  ProjectQkv(P, o, T, a.xn, qp, kp, v);
  if (qk_norm) {
    ops_->rmsnorm_forward(qp, P + o.q_norm, T * H, D, eps_, q, a.rstd_q.at(l));
    ops_->rmsnorm_forward(kp, P + o.k_norm, T * Hkv, D, eps_, k, a.rstd_k.at(l));
  }
  ops_->rope_apply(q, in.positions, T, H, D, cos_d_.data(), sin_d_.data(), false);
  ops_->rope_apply(k, in.positions, T, Hkv, D, cos_d_.data(), sin_d_.data(), false);
  if (in.cache != nullptr) {
    // The target rows are zero: the scatter-add is a copy.
    ops_->embedding_backward(in.kv_rows, T, k, KD, in.cache->k[l].data());
    ops_->embedding_backward(in.kv_rows, T, v, KD, in.cache->v[l].data());
  }
  if (in.cu != nullptr && in.attention != nullptr) {
    in.attention->Attend(l, q, k, v, attn, a.lse.at(l));
  } else if (in.cu != nullptr && layer_types_[l].kind == LayerKind::kLinear) {
    ops_->linear_attention_forward(LinearAttention(), q, k, v, LinearDecay(T), in.cu, in.num_seqs, T, nullptr, attn,
                                   nullptr);
  } else if (in.cu != nullptr) {
    ops_->attention_forward(ap, q, k, v, in.cu, in.num_seqs, T, attn, a.lse.at(l));
  } else {
    ops_->decode_attention(ap, q, T, 1, in.cache->k[l].data(), in.cache->v[l].data(), in.cache->capacity, in.cache_len,
                           attn);
  }
  if (!block) return;
  if (xmid != x) mem_->CopyOnDevice(xmid, x, TC * sizeof(float));
  ops_->matmul(false, true, T, C, HD, 1.f, attn, HD, P + o.o, HD, 1.f, xmid, C);
}

void Decoder::Layer(const float* P, int l, const DecoderInput& in, const DecoderActivations& a) const {
  const int C = dims_.C, I = dims_.I;
  const LayerOffsets& o = layout_.layer(l);
  const int T = in.rows;
  const size_t TC = static_cast<size_t>(T) * C;
  float* xmid = a.xmid.at(l);
  float* xo = a.x.at(l + 1);
  float* gate = a.gate.at(l);
  float* up = a.up.at(l);

  AttentionBlock(P, l, in, a, /*block=*/true);
  ops_->rmsnorm_forward(xmid, P + o.post_norm, T, C, eps_, a.xn, a.rstd_post.at(l));
  ops_->matmul(false, true, T, I, C, 1.f, a.xn, C, P + o.gate, C, 0.f, gate, I);
  ops_->matmul(false, true, T, I, C, 1.f, a.xn, C, P + o.up, C, 0.f, up, I);
  ops_->swiglu_forward(gate, up, static_cast<size_t>(T) * I, a.hact);
  if (xo != xmid) mem_->CopyOnDevice(xo, xmid, TC * sizeof(float));
  ops_->matmul(false, true, T, C, I, 1.f, a.hact, I, P + o.down, I, 1.f, xo, C);
}

void Decoder::RecomputeLayer(const float* P, int layer, const DecoderInput& in, const DecoderActivations& acts,
                             LayerPart part) const {
  TANDEM_CHECK(in.cu != nullptr && in.cache == nullptr);
  AttentionBlock(P, layer, in, acts, part == LayerPart::kAttentionBlock);
}

void Decoder::Forward(ParamProvider& pp, const DecoderInput& in, const DecoderActivations& acts,
                      const DecoderOutput& out) const {
  TANDEM_CHECK(in.cu != nullptr || (in.cache != nullptr && in.cache_len != nullptr));
  TANDEM_CHECK(in.cache == nullptr || in.kv_rows != nullptr);
  {
    const float* P = pp.AcquireParams(0);
    pp.Prefetch(1);
    ops_->embedding_forward(in.tokens, in.rows, P + layout_.embed_offset(), dims_.C, acts.x.at(0));
    pp.ReleaseParams(0);
  }
  for (int l = 0; l < dims_.L; ++l) {
    const int unit = layout_.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    Layer(P, l, in, acts);
    pp.ReleaseParams(unit);
  }
  const float* last = acts.x.at(dims_.L);
  if (out.select != nullptr) {
    ops_->embedding_forward(out.select, out.rows, last, dims_.C, acts.xn);
    last = acts.xn;
  }
  const int fu = layout_.final_unit();
  const float* P = pp.AcquireParams(fu);
  if (layout_.tied()) pp.Prefetch(0);  // the LM head comes next
  ops_->rmsnorm_forward(last, P + layout_.final_norm_offset(), out.rows, dims_.C, eps_, out.xn, out.rstd);
  pp.ReleaseParams(fu);
}

void Decoder::Logits(ParamProvider& pp, const float* xn, int rows, float* logits) const {
  const int hu = layout_.lm_head_unit();
  const float* P = pp.AcquireParams(hu);
  ops_->matmul(false, true, rows, dims_.V, dims_.C, 1.f, xn, dims_.C, P + layout_.lm_head_offset(), dims_.C, 0.f,
               logits, dims_.V);
  pp.ReleaseParams(hu);
}

}  // namespace tandem::model
