// Model: batch preparation, the training forward (log-probs, logits) over
// the shared decoder, initialisation and the SFT loss. The backward is in
// model_backward.cc.
#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/model/soft_prompt.h"

namespace tandem::model {

void Batch::AddSequence(std::span<const int32_t> seq) {
  if (cu_seqlens.empty()) cu_seqlens.push_back(0);
  if (seq.size() < 2) return;
  for (size_t i = 0; i + 1 < seq.size(); ++i) {
    tokens.push_back(seq[i]);
    targets.push_back(seq[i + 1]);
    positions.push_back(static_cast<int32_t>(i));
  }
  cu_seqlens.push_back(static_cast<int32_t>(tokens.size()));
}

// The decoder's attention under sequence parallelism: the layer's kind
// picks softmax or linear; the first error stops later calls and is kept.
void Model::SpHook::Attend(int layer, const float* q, const float* k, const float* v, float* out, float* lse) {
  if (!m_->sp_status_.ok()) return;
  const Decoder& d = m_->decoder_;
  if (d.layer_type(layer).kind == LayerKind::kLinear) {
    m_->sp_status_ = m_->sp_->LinearForward(d.LinearAttention(), m_->slice_, m_->local_cu_.data(), m_->nseq_, q, k, v,
                                            d.LinearDecay(m_->T_), out);
  } else {
    m_->sp_status_ = m_->sp_->SoftmaxForward(d.Attention(layer), m_->slice_, q, k, v, out, lse);
  }
}

Model::Model(const ModelConfig& config, kernels::Ops* ops, int max_tokens, kernels::DeviceMemory* memory)
    : decoder_(config, ops, memory), d_(decoder_.dims()), ops_(ops), mem_(decoder_.memory()) {
  lm_chunk_ = std::clamp(262144 / std::max(d_.V, 1), 8, 1024);
  qk_norm_ = config.HasQkNorm();
  // A failure here leaves cap_ at 0: the first Forward* retries and reports.
  if (max_tokens > 0) (void)EnsureCapacity(max_tokens, ActivationCheckpointing::kNone);
}

absl::Status Model::EnsureCapacity(int t, ActivationCheckpointing mode) {
  if (t <= cap_ && mode == ckpt_) return absl::OkStatus();
  t = std::max(t, cap_);
  const size_t T = static_cast<size_t>(t);
  const size_t L = d_.L;
  const bool keep_mid = mode != ActivationCheckpointing::kLayer;
  const bool keep_core = mode == ActivationCheckpointing::kNone;
  // Per-layer stores hold L layers; what the mode recomputes, one layer.
  const size_t Lm = keep_mid ? L : 1, Lc = keep_core ? L : 1;
  size_t n = 0, saved = 0;
  auto take = [&](size_t count) {
    size_t o = n;
    n += (count + 15) / 16 * 16;
    return o;
  };
  // A per-layer store: counted as saved when it holds every layer.
  auto store = [&](size_t layers, size_t count) {
    const size_t o = take(layers * count);
    if (layers > 1 || L == 1) saved += n - o;
    return o;
  };
  const size_t o_x = store(L + 1, T * d_.C), o_xmid = store(Lm, T * d_.C), o_q = store(Lc, T * d_.HD),
               o_k = store(Lc, T * d_.KD), o_v = store(Lc, T * d_.KD), o_attn = store(Lc, T * d_.HD),
               o_lse = store(Lc, T * d_.H), o_r1 = store(Lm, T), o_r2 = store(Lm, T), o_rf = take(T),
               o_xnf = take(T * d_.C), o_xn = take(T * d_.C), o_hact = take(T * d_.I), o_dres = take(T * d_.C),
               o_dtmp = take(T * d_.C), o_dxn = take(T * d_.C), o_dattn = take(T * d_.HD), o_dq = take(T * d_.HD),
               o_dk = take(T * d_.KD), o_dv = take(T * d_.KD), o_dh = take(T * d_.I), o_dgate = take(T * d_.I),
               o_dup = take(T * d_.I), o_dup2 = take(T * d_.I), o_rt = take(T),
               o_lm = take(static_cast<size_t>(lm_chunk_) * d_.V), o_logp = take(T), o_ent = take(T), o_dlogp = take(T);
  const size_t qk = qk_norm_ ? 1 : 0;
  const size_t o_rq = store(qk * Lc, T * d_.H), o_rk = store(qk * Lc, T * d_.Hkv), o_qraw = take(qk * T * d_.HD),
               o_kraw = take(qk * T * d_.KD), o_dqraw = take(qk * T * d_.HD), o_dkraw = take(qk * T * d_.KD);
  ws_.reset();  // free the old workspace before allocating the new one
  cap_ = 0;
  saved_floats_ = 0;
  have_forward_ = false;
  if (!ws_.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(absl::StrCat("model: cannot allocate a workspace of ", n * sizeof(float),
                                                     " bytes for ", t, " tokens in ", mem_->name(), " memory"));
  }
  float* b = ws_.data();
  x_ = b + o_x;
  xmid_ = b + o_xmid;
  q_ = b + o_q;
  k_ = b + o_k;
  v_ = b + o_v;
  attn_ = b + o_attn;
  lse_ = b + o_lse;
  dup2_ = b + o_dup2;
  rstd1_ = b + o_r1;
  rstd2_ = b + o_r2;
  rstdf_ = b + o_rf;
  xnf_ = b + o_xnf;
  xn_ = b + o_xn;
  hact_ = b + o_hact;
  dres_ = b + o_dres;
  dtmp_ = b + o_dtmp;
  dxn_ = b + o_dxn;
  dattn_ = b + o_dattn;
  dq_ = b + o_dq;
  dk_ = b + o_dk;
  dv_ = b + o_dv;
  dh_ = b + o_dh;
  dgate_ = b + o_dgate;
  dup_ = b + o_dup;
  rstd_tmp_ = b + o_rt;
  lm_scratch_ = b + o_lm;
  logp_ = b + o_logp;
  entropy_ = b + o_ent;
  dlogp_ = b + o_dlogp;
  if (qk_norm_) {
    rstdq_ = b + o_rq;
    rstdk_ = b + o_rk;
    qraw_ = b + o_qraw;
    kraw_ = b + o_kraw;
    dqraw_ = b + o_dqraw;
    dkraw_ = b + o_dkraw;
  }
  // Index arrays: tokens, targets, positions (T each) and cu_seqlens, whose
  // size is nseq+1 (grown on demand in Prepare).
  idx_host_.reserve(4 * T + 1);
  cap_ = t;
  ckpt_ = mode;
  keep_mid_ = keep_mid;
  keep_core_ = keep_core;
  saved_floats_ = saved;
  return absl::OkStatus();
}

absl::Status Model::EnsureMlpStore(int t) {
  if (t <= mlp_cap_) return absl::OkStatus();
  const size_t n = static_cast<size_t>(d_.L) * t * d_.I;
  mlp_.reset();
  mlp_cap_ = 0;
  gate_ = up_ = nullptr;
  have_forward_ = false;
  if (!mlp_.Allocate(mem_, 2 * n)) {
    return absl::ResourceExhaustedError(absl::StrCat("model: cannot allocate ", 2 * n * sizeof(float),
                                                     " bytes of MLP activations for ", t, " tokens in ", mem_->name(),
                                                     " memory"));
  }
  gate_ = mlp_.data();
  up_ = mlp_.data() + n;
  mlp_cap_ = t;
  return absl::OkStatus();
}

absl::Status Model::EnsureLowRank(int t, int r) {
  if (t <= lr_cap_ && r <= lr_rank_) return absl::OkStatus();
  const int tc = std::max(t, lr_cap_), rc = std::max(r, lr_rank_);
  const size_t n = static_cast<size_t>(rc) * (d_.C + tc + d_.I);
  low_rank_ws_.reset();
  lr_cap_ = lr_rank_ = 0;
  if (!low_rank_ws_.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model: cannot allocate ", n * sizeof(float), " bytes of low-rank gradient scratch"));
  }
  lr_p_ = low_rank_ws_.data();
  lr_a_ = lr_p_ + static_cast<size_t>(rc) * d_.C;
  lr_b_ = lr_a_ + static_cast<size_t>(rc) * tc;
  lr_cap_ = tc;
  lr_rank_ = rc;
  return absl::OkStatus();
}

void Model::MakeProjection(uint64_t seed, int layer, int r) {
  const int C = d_.C;
  // SplitMix64 of (seed, layer): independent streams per layer.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  std::mt19937_64 rng(z);
  std::normal_distribution<double> nd(0.0, 1.0);
  // Columns of P, Gram-Schmidt (twice, for orthogonality in fp32) in double.
  std::vector<double> q(static_cast<size_t>(r) * C);
  for (int j = 0; j < r; ++j) {
    double* c = q.data() + static_cast<size_t>(j) * C;
    for (int i = 0; i < C; ++i) c[i] = nd(rng);
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        const double* o = q.data() + static_cast<size_t>(k) * C;
        double dot = 0;
        for (int i = 0; i < C; ++i) dot += o[i] * c[i];
        for (int i = 0; i < C; ++i) c[i] -= dot * o[i];
      }
    }
    double norm = 0;
    for (int i = 0; i < C; ++i) norm += c[i] * c[i];
    norm = std::sqrt(norm);
    for (int i = 0; i < C; ++i) c[i] /= norm;
  }
  lr_host_.resize(static_cast<size_t>(C) * r);  // row-major [C, r]
  for (int i = 0; i < C; ++i) {
    for (int j = 0; j < r; ++j) {
      lr_host_[static_cast<size_t>(i) * r + j] = static_cast<float>(q[static_cast<size_t>(j) * C + i]);
    }
  }
  mem_->CopyToDevice(lr_p_, lr_host_.data(), lr_host_.size() * sizeof(float));
}

absl::Status Model::Prepare(const Batch& batch, ActivationCheckpointing mode) {
  RETURN_IF_ERROR(CheckBatch(batch));
  have_forward_ = false;
  T_ = batch.num_tokens();
  nseq_ = batch.num_seqs();
  RETURN_IF_ERROR(EnsureCapacity(T_, mode));
  const size_t T = T_;
  const size_t n = 3 * T + batch.cu_seqlens.size();
  if (idx_.size() < n) {
    // cu_seqlens may hold empty sequences, so nseq+1 can exceed T+1.
    if (!idx_.Allocate(mem_, std::max(n, 4 * static_cast<size_t>(cap_) + 1))) {
      return absl::ResourceExhaustedError(
          absl::StrCat("model: cannot allocate ", n * sizeof(int32_t), " bytes of batch indices"));
    }
  }
  idx_host_.clear();
  idx_host_.insert(idx_host_.end(), batch.tokens.begin(), batch.tokens.end());
  idx_host_.insert(idx_host_.end(), batch.targets.begin(), batch.targets.end());
  idx_host_.insert(idx_host_.end(), batch.positions.begin(), batch.positions.end());
  idx_host_.insert(idx_host_.end(), batch.cu_seqlens.begin(), batch.cu_seqlens.end());
  idx_.Upload(idx_host_.data(), n);
  const int32_t* d = idx_.data();
  tokens_ = d;
  targets_ = d + T;
  positions_ = d + 2 * T;
  cu_ = d + 3 * T;
  sliced_ = sp_ != nullptr && batch.slice.has_value();
  if (sliced_) {
    slice_ = *batch.slice;
    local_cu_ = batch.cu_seqlens;
  }
  const int32_t max_position = *std::max_element(batch.positions.begin(), batch.positions.end());
  RETURN_IF_ERROR(decoder_.EnsureRope(max_position + 1));
  RETURN_IF_ERROR(decoder_.EnsureLinearDecay(T_));
  return decoder_.MemoryStatus("model");
}

absl::Status Model::CheckBatch(const Batch& b) const {
  const size_t T = b.tokens.size();
  if (T == 0) return absl::InvalidArgumentError("batch has no tokens");
  if (sp_ == nullptr && b.slice.has_value()) {
    return absl::InvalidArgumentError(
        "batch is a sequence-parallel slice but the model has no sequence-parallel group");
  }
  if (sp_ != nullptr && b.slice.has_value()) {
    const SequenceSlice& s = *b.slice;
    if (s.rank != sp_->rank() || s.size != sp_->size() || s.rows != static_cast<int>(T)) {
      return absl::InvalidArgumentError(absl::StrCat("model: the batch is rank ", s.rank, " of ", s.size, " (", s.rows,
                                                     " rows), the group rank ", sp_->rank(), " of ", sp_->size(),
                                                     " with ", T, " rows"));
    }
    if (std::string_view(mem_->name()) != "host") {
      return absl::FailedPreconditionError(absl::StrCat(
          "model: sequence parallelism runs on host memory (CPU backends); this model's memory is ", mem_->name()));
    }
  }
  // Per-head rows (attention lse, q/k norms) are indexed with 32-bit ints.
  if (T > (1u << 24) || T * static_cast<size_t>(d_.H) > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("batch too large: ", T, " tokens"));
  }
  if (b.targets.size() != T || b.positions.size() != T) {
    return absl::InvalidArgumentError(absl::StrCat("batch: tokens (", T, "), targets (", b.targets.size(),
                                                   ") and positions (", b.positions.size(), ") must have equal sizes"));
  }
  if (b.cu_seqlens.size() < 2 || b.cu_seqlens.front() != 0 || b.cu_seqlens.back() != static_cast<int32_t>(T)) {
    return absl::InvalidArgumentError("batch: cu_seqlens must start at 0 and end at the number of tokens");
  }
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i) {
    if (b.cu_seqlens[i] < b.cu_seqlens[i - 1]) {
      return absl::InvalidArgumentError("batch: cu_seqlens must not decrease");
    }
  }
  // Input ids past the vocabulary read a soft prompt's rows (soft_prompt.h).
  const int32_t ids = d_.V + config().tandem_soft_prompt_tokens;
  for (size_t t = 0; t < T; ++t) {
    if (b.tokens[t] < 0 || b.tokens[t] >= ids) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: token id ", b.tokens[t], " at row ", t, " outside [0, ", ids, ")"));
    }
    if (b.targets[t] < 0 || b.targets[t] >= d_.V) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: target id ", b.targets[t], " at row ", t, " outside [0, ", d_.V, ")"));
    }
    if (b.positions[t] < 0 || b.positions[t] >= (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: position ", b.positions[t], " at row ", t, " out of range"));
    }
  }
  return absl::OkStatus();
}

DecoderActivations Model::Activations(bool recompute_mlp) const {
  const size_t T = T_;
  const size_t mid = keep_mid_ ? T : 0, core = keep_core_ ? T : 0;
  DecoderActivations a;
  a.x = {x_, T * d_.C};
  a.xmid = {xmid_, mid * d_.C};
  a.q = {q_, core * d_.HD};
  a.k = {k_, core * d_.KD};
  a.v = {v_, core * d_.KD};
  a.attn = {attn_, core * d_.HD};
  a.lse = {lse_, core * d_.H};
  a.rstd_in = {rstd1_, mid};
  a.rstd_post = {rstd2_, mid};
  // Recomputing: the gradient scratch holds each layer's SwiGLU inputs.
  a.gate = recompute_mlp ? LayerBuffer{dgate_, 0} : LayerBuffer{gate_, T * d_.I};
  a.up = recompute_mlp ? LayerBuffer{dup_, 0} : LayerBuffer{up_, T * d_.I};
  if (qk_norm_) {
    a.q_raw = {qraw_, 0};
    a.k_raw = {kraw_, 0};
    a.rstd_q = {rstdq_, core * d_.H};
    a.rstd_k = {rstdk_, core * d_.Hkv};
  }
  a.xn = xn_;
  a.hact = hact_;
  return a;
}

DecoderInput Model::Input() const {
  DecoderInput in;
  in.rows = T_;
  in.tokens = tokens_;
  in.positions = positions_;
  in.cu = cu_;
  in.num_seqs = nseq_;
  // A slice's attention (and a checkpointed layer's recomputation) goes
  // through the sequence-parallel group.
  if (sliced_) in.attention = &sp_hook_;
  return in;
}

void Model::ForwardHidden(ParamProvider& pp, bool recompute_mlp) {
  DecoderOutput out;
  out.rows = T_;
  out.xn = xnf_;
  out.rstd = rstdf_;
  sp_status_ = absl::OkStatus();
  decoder_.Forward(pp, Input(), Activations(recompute_mlp), out);
}

absl::Status Model::ForwardLogprobs(const Batch& batch, ParamProvider& pp, float* logp, float* entropy,
                                    const ForwardOptions& options) {
  RETURN_IF_ERROR(Prepare(batch, want_ckpt_));
  // Layer checkpointing recomputes the SwiGLU inputs with the rest.
  recomputed_mlp_ = options.recompute_mlp || want_ckpt_ == ActivationCheckpointing::kLayer;
  if (!recomputed_mlp_) RETURN_IF_ERROR(EnsureMlpStore(T_));
  ForwardHidden(pp, recomputed_mlp_);
  RETURN_IF_ERROR(sp_status_);
  const int hu = layout().lm_head_unit();
  const float* P = pp.AcquireParams(hu);
  ops_->lm_head_logprobs_forward(xnf_, P + layout().lm_head_offset(), targets_, T_, d_.C, d_.V, lm_chunk_, lm_scratch_,
                                 logp_, entropy != nullptr ? entropy_ : nullptr);
  pp.ReleaseParams(hu);
  mem_->CopyToHost(logp, logp_, static_cast<size_t>(T_) * sizeof(float));
  if (entropy != nullptr) {
    mem_->CopyToHost(entropy, entropy_, static_cast<size_t>(T_) * sizeof(float));
  }
  RETURN_IF_ERROR(decoder_.MemoryStatus("model"));
  have_forward_ = true;
  return absl::OkStatus();
}

absl::Status Model::ForwardLogits(const Batch& batch, ParamProvider& pp, float* logits) {
  RETURN_IF_ERROR(Prepare(batch, want_ckpt_));
  const size_t n = static_cast<size_t>(T_) * d_.V;
  kernels::DeviceArray<float> out;
  if (!out.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(absl::StrCat("model: cannot allocate ", n * sizeof(float), " bytes of logits"));
  }
  ForwardHidden(pp, /*recompute_mlp=*/true);  // nothing is kept for a backward
  RETURN_IF_ERROR(sp_status_);
  decoder_.Logits(pp, xnf_, T_, out.data());
  out.Download(logits, n);
  return decoder_.MemoryStatus("model");
}

void Model::InitParams(uint64_t seed, float* params) const {
  std::fill(params, params + layout().total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kStd = 0.02;  // HF initializer_range
  auto uniform = [&rng]() {      // (0, 1]
    return (static_cast<double>(rng() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  };
  for (const TensorView& t : layout().tensors()) {
    // The soft prompt draws nothing (InitSoftPrompt copies embedding rows),
    // so a seed gives the same base weights with and without it.
    if (t.name == kSoftPromptTensor) continue;
    float* p = params + t.offset;
    switch (t.kind) {
      case TensorView::Kind::kNorm:
        std::fill(p, p + t.numel, 1.f);
        break;
      case TensorView::Kind::kBias:
        break;
      case TensorView::Kind::kMatrix:
        for (size_t i = 0; i < t.numel; i += 2) {
          const double u1 = uniform(), u2 = uniform();
          const double r = std::sqrt(-2.0 * std::log(u1));
          p[i] = static_cast<float>(kStd * r * std::cos(kTwoPi * u2));
          if (i + 1 < t.numel) p[i + 1] = static_cast<float>(kStd * r * std::sin(kTwoPi * u2));
        }
        break;
    }
  }
  InitSoftPrompt(layout(), params);
}

float SftLoss(std::span<const float> logp, std::span<const float> mask, float* dlogp) {
  double n = 0, sum = 0;
  for (size_t t = 0; t < logp.size(); ++t) {
    n += mask[t];
    sum += static_cast<double>(mask[t]) * logp[t];
  }
  for (size_t t = 0; t < logp.size(); ++t) {
    dlogp[t] = n > 0 ? static_cast<float>(-mask[t] / n) : 0.f;
  }
  return n > 0 ? static_cast<float>(-sum / n) : 0.f;
}

}  // namespace tandem::model
