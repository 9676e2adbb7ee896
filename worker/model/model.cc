#include "worker/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "absl/strings/str_cat.h"

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

Model::Model(const ModelConfig& config, kernels::Ops* ops, int max_tokens,
             kernels::DeviceMemory* memory)
    : config_(config),
      layout_(config),
      ops_(ops),
      owned_memory_(memory == nullptr ? kernels::MakeHostMemory() : nullptr),
      mem_(memory == nullptr ? owned_memory_.get() : memory) {
  C_ = config.hidden_size;
  H_ = config.num_attention_heads;
  Hkv_ = config.KvHeads();
  D_ = config.HeadDim();
  I_ = config.intermediate_size;
  V_ = config.vocab_size;
  L_ = config.num_hidden_layers;
  HD_ = H_ * D_;
  KD_ = Hkv_ * D_;
  lm_chunk_ = std::clamp(262144 / std::max(V_, 1), 8, 1024);
  qk_norm_ = config.HasQkNorm();
  // A failure here leaves cap_ at 0: the first Forward* retries and reports.
  if (max_tokens > 0) (void)EnsureCapacity(max_tokens);
}

absl::Status Model::MemoryStatus() const {
  if (mem_->ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("model: device memory (", mem_->name(),
                                          "): ", mem_->last_error()));
}

kernels::AttentionParams Model::Attn(int layer) const {
  kernels::AttentionParams p;
  p.num_heads = H_;
  p.num_kv_heads = Hkv_;
  p.head_dim = D_;
  p.causal = true;
  p.window = config_.LayerWindow(layer);
  return p;
}

absl::Status Model::EnsureCapacity(int t) {
  if (t <= cap_) return absl::OkStatus();
  const size_t T = static_cast<size_t>(t);
  const size_t L = L_;
  size_t n = 0;
  auto take = [&](size_t count) { size_t o = n; n += (count + 15) / 16 * 16; return o; };
  const size_t o_x = take((L + 1) * T * C_), o_xmid = take(L * T * C_),
               o_q = take(L * T * HD_), o_k = take(L * T * KD_),
               o_v = take(L * T * KD_), o_attn = take(L * T * HD_),
               o_lse = take(L * T * H_), o_r1 = take(L * T), o_r2 = take(L * T),
               o_rf = take(T), o_xnf = take(T * C_), o_xn = take(T * C_),
               o_hact = take(T * I_), o_dres = take(T * C_),
               o_dtmp = take(T * C_), o_dxn = take(T * C_),
               o_dattn = take(T * HD_), o_dq = take(T * HD_),
               o_dk = take(T * KD_), o_dv = take(T * KD_),
               o_dh = take(T * I_), o_dgate = take(T * I_),
               o_dup = take(T * I_), o_dup2 = take(T * I_), o_rt = take(T),
               o_lm = take(static_cast<size_t>(lm_chunk_) * V_),
               o_logp = take(T), o_ent = take(T), o_dlogp = take(T);
  const size_t qk = qk_norm_ ? 1 : 0;
  const size_t o_rq = take(qk * L * T * H_), o_rk = take(qk * L * T * Hkv_),
               o_qraw = take(qk * T * HD_), o_kraw = take(qk * T * KD_),
               o_dqraw = take(qk * T * HD_), o_dkraw = take(qk * T * KD_);
  ws_.reset();  // free the old workspace before allocating the larger one
  cap_ = 0;
  have_forward_ = false;
  if (!ws_.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model: cannot allocate a workspace of ", n * sizeof(float), " bytes for ",
        t, " tokens in ", mem_->name(), " memory"));
  }
  float* b = ws_.data();
  x_ = b + o_x; xmid_ = b + o_xmid; q_ = b + o_q; k_ = b + o_k; v_ = b + o_v;
  attn_ = b + o_attn; lse_ = b + o_lse; dup2_ = b + o_dup2;
  rstd1_ = b + o_r1; rstd2_ = b + o_r2; rstdf_ = b + o_rf; xnf_ = b + o_xnf;
  xn_ = b + o_xn; hact_ = b + o_hact; dres_ = b + o_dres; dtmp_ = b + o_dtmp;
  dxn_ = b + o_dxn; dattn_ = b + o_dattn; dq_ = b + o_dq; dk_ = b + o_dk;
  dv_ = b + o_dv; dh_ = b + o_dh; dgate_ = b + o_dgate; dup_ = b + o_dup;
  rstd_tmp_ = b + o_rt; lm_scratch_ = b + o_lm;
  logp_ = b + o_logp; entropy_ = b + o_ent; dlogp_ = b + o_dlogp;
  if (qk_norm_) {
    rstdq_ = b + o_rq; rstdk_ = b + o_rk; qraw_ = b + o_qraw; kraw_ = b + o_kraw;
    dqraw_ = b + o_dqraw; dkraw_ = b + o_dkraw;
  }
  // Index arrays: tokens, targets, positions (T each) and cu_seqlens, whose
  // size is nseq+1 (grown on demand in Prepare).
  idx_host_.reserve(4 * T + 1);
  cap_ = t;
  return absl::OkStatus();
}

absl::Status Model::EnsureMlpStore(int t) {
  if (t <= mlp_cap_) return absl::OkStatus();
  const size_t n = static_cast<size_t>(L_) * t * I_;
  mlp_.reset();
  mlp_cap_ = 0;
  gate_ = up_ = nullptr;
  have_forward_ = false;
  if (!mlp_.Allocate(mem_, 2 * n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model: cannot allocate ", 2 * n * sizeof(float), " bytes of MLP activations for ", t,
        " tokens in ", mem_->name(), " memory"));
  }
  gate_ = mlp_.data();
  up_ = mlp_.data() + n;
  mlp_cap_ = t;
  return absl::OkStatus();
}

absl::Status Model::EnsureLowRank(int t, int r) {
  if (t <= lr_cap_ && r <= lr_rank_) return absl::OkStatus();
  const int tc = std::max(t, lr_cap_), rc = std::max(r, lr_rank_);
  const size_t n = static_cast<size_t>(rc) * (C_ + tc + I_);
  low_rank_ws_.reset();
  lr_cap_ = lr_rank_ = 0;
  if (!low_rank_ws_.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model: cannot allocate ", n * sizeof(float), " bytes of low-rank gradient scratch"));
  }
  lr_p_ = low_rank_ws_.data();
  lr_a_ = lr_p_ + static_cast<size_t>(rc) * C_;
  lr_b_ = lr_a_ + static_cast<size_t>(rc) * tc;
  lr_cap_ = tc;
  lr_rank_ = rc;
  return absl::OkStatus();
}

void Model::MakeProjection(uint64_t seed, int layer, int r) {
  // SplitMix64 of (seed, layer): independent streams per layer.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  std::mt19937_64 rng(z);
  std::normal_distribution<double> nd(0.0, 1.0);
  // Columns of P, Gram-Schmidt (twice, for orthogonality in fp32) in double.
  std::vector<double> q(static_cast<size_t>(r) * C_);
  for (int j = 0; j < r; ++j) {
    double* c = q.data() + static_cast<size_t>(j) * C_;
    for (int i = 0; i < C_; ++i) c[i] = nd(rng);
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < j; ++k) {
        const double* o = q.data() + static_cast<size_t>(k) * C_;
        double dot = 0;
        for (int i = 0; i < C_; ++i) dot += o[i] * c[i];
        for (int i = 0; i < C_; ++i) c[i] -= dot * o[i];
      }
    }
    double norm = 0;
    for (int i = 0; i < C_; ++i) norm += c[i] * c[i];
    norm = std::sqrt(norm);
    for (int i = 0; i < C_; ++i) c[i] /= norm;
  }
  lr_host_.resize(static_cast<size_t>(C_) * r);  // row-major [C, r]
  for (int i = 0; i < C_; ++i) {
    for (int j = 0; j < r; ++j) {
      lr_host_[static_cast<size_t>(i) * r + j] = static_cast<float>(q[static_cast<size_t>(j) * C_ + i]);
    }
  }
  mem_->CopyToDevice(lr_p_, lr_host_.data(), lr_host_.size() * sizeof(float));
}

absl::Status Model::EnsureRope(int max_position) {
  const kernels::RopeConfig rc = config_.Rope();
  const int need = max_position + 1;
  // Dynamic NTK: HF recomputes the base from the longest sequence in the
  // forward once it exceeds the original maximum.
  const int key = rc.type == kernels::RopeType::kDynamicNtk
                      ? std::max(need, rc.original_max_position)
                      : 0;
  if (key == rope_seq_key_ && need <= rope_rows_) return absl::OkStatus();
  // Sized by the positions in use (grown by doubling), never by
  // max_position_embeddings: a config may declare millions of positions.
  const int rows = std::max(RopeRowsFor(need), rope_rows_);
  const size_t n = static_cast<size_t>(rows) * D_ / 2;
  cos_.assign(n, 0.f);
  sin_.assign(n, 0.f);
  kernels::rope_tables(rc, key > 0 ? key : rows, rows, cos_.data(), sin_.data());
  rope_rows_ = 0;
  rope_seq_key_ = -1;
  if (cos_d_.size() < n || sin_d_.size() < n) {
    sin_d_.reset();
    cos_d_.reset();
    if (!cos_d_.Allocate(mem_, n) || !sin_d_.Allocate(mem_, n)) {
      cos_d_.reset();
      sin_d_.reset();
      return absl::ResourceExhaustedError(absl::StrCat(
          "model: cannot allocate rope tables of ", 2 * n * sizeof(float), " bytes"));
    }
  }
  cos_d_.Upload(cos_.data(), n);
  sin_d_.Upload(sin_.data(), n);
  rope_rows_ = rows;
  rope_seq_key_ = key;
  return absl::OkStatus();
}

absl::Status Model::Prepare(const Batch& batch) {
  absl::Status s = CheckBatch(batch);
  if (!s.ok()) return s;
  have_forward_ = false;
  T_ = batch.num_tokens();
  nseq_ = batch.num_seqs();
  s = EnsureCapacity(T_);
  if (!s.ok()) return s;
  const size_t T = T_;
  const size_t n = 3 * T + batch.cu_seqlens.size();
  if (idx_.size() < n) {
    // cu_seqlens may hold empty sequences, so nseq+1 can exceed T+1.
    if (!idx_.Allocate(mem_, std::max(n, 4 * static_cast<size_t>(cap_) + 1))) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "model: cannot allocate ", n * sizeof(int32_t), " bytes of batch indices"));
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
  s = EnsureRope(*std::max_element(batch.positions.begin(), batch.positions.end()));
  if (!s.ok()) return s;
  return MemoryStatus();
}

absl::Status Model::CheckBatch(const Batch& b) const {
  const size_t T = b.tokens.size();
  if (T == 0) return absl::InvalidArgumentError("batch has no tokens");
  // Per-head rows (attention lse, q/k norms) are indexed with 32-bit ints.
  if (T > (1u << 24) || T * static_cast<size_t>(H_) > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("batch too large: ", T, " tokens"));
  }
  if (b.targets.size() != T || b.positions.size() != T) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: tokens (", T, "), targets (", b.targets.size(),
        ") and positions (", b.positions.size(), ") must have equal sizes"));
  }
  if (b.cu_seqlens.size() < 2 || b.cu_seqlens.front() != 0 ||
      b.cu_seqlens.back() != static_cast<int32_t>(T)) {
    return absl::InvalidArgumentError(
        "batch: cu_seqlens must start at 0 and end at the number of tokens");
  }
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i) {
    if (b.cu_seqlens[i] < b.cu_seqlens[i - 1]) {
      return absl::InvalidArgumentError("batch: cu_seqlens must not decrease");
    }
  }
  for (size_t t = 0; t < T; ++t) {
    if (b.tokens[t] < 0 || b.tokens[t] >= V_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: token id ", b.tokens[t], " at row ", t, " outside [0, ", V_, ")"));
    }
    if (b.targets[t] < 0 || b.targets[t] >= V_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: target id ", b.targets[t], " at row ", t, " outside [0, ", V_, ")"));
    }
    if (b.positions[t] < 0 || b.positions[t] >= (1 << 24)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: position ", b.positions[t], " at row ", t, " out of range"));
    }
  }
  return absl::OkStatus();
}

void Model::ProjectQkv(const float* P, const LayerOffsets& o, int T, float* q,
                       float* k, float* v) {
  ops_->matmul(false, true, T, HD_, C_, 1.f, xn_, C_, P + o.q, C_, 0.f, q, HD_);
  ops_->matmul(false, true, T, KD_, C_, 1.f, xn_, C_, P + o.k, C_, 0.f, k, KD_);
  if (v != nullptr) {
    ops_->matmul(false, true, T, KD_, C_, 1.f, xn_, C_, P + o.v, C_, 0.f, v, KD_);
  }
  if (o.q_bias != SIZE_MAX) {
    ops_->add_bias(q, P + o.q_bias, T, HD_);
    ops_->add_bias(k, P + o.k_bias, T, KD_);
    if (v != nullptr) ops_->add_bias(v, P + o.v_bias, T, KD_);
  }
}

void Model::ForwardHidden(ParamProvider& pp, bool recompute_mlp) {
  const int T = T_;
  const size_t TC = static_cast<size_t>(T) * C_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float* cosb = cos_d_.data();
  const float* sinb = sin_d_.data();
  {
    const float* P = pp.AcquireParams(0);
    pp.Prefetch(1);
    ops_->embedding_forward(tokens_, T, P + layout_.embed_offset(), C_, x_);
    pp.ReleaseParams(0);
  }
  for (int l = 0; l < L_; ++l) {
    const int unit = layout_.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    const LayerOffsets& o = layout_.layer(l);
    const size_t lt = static_cast<size_t>(l) * T;
    float* x = x_ + l * TC;
    float* xo = x_ + (l + 1) * TC;
    float* xmid = xmid_ + l * TC;
    float* q = q_ + lt * HD_;
    float* k = k_ + lt * KD_;
    float* v = v_ + lt * KD_;
    float* attn = attn_ + lt * HD_;
    // Recomputing: the gradient scratch holds this layer's SwiGLU inputs.
    float* gate = recompute_mlp ? dgate_ : gate_ + lt * I_;
    float* up = recompute_mlp ? dup_ : up_ + lt * I_;
    ops_->rmsnorm_forward(x, P + o.input_norm, T, C_, eps, xn_, rstd1_ + lt);
    ProjectQkv(P, o, T, qk_norm_ ? qraw_ : q, qk_norm_ ? kraw_ : k, v);
    if (qk_norm_) {
      ops_->rmsnorm_forward(qraw_, P + o.q_norm, T * H_, D_, eps, q, rstdq_ + lt * H_);
      ops_->rmsnorm_forward(kraw_, P + o.k_norm, T * Hkv_, D_, eps, k, rstdk_ + lt * Hkv_);
    }
    ops_->rope_apply(q, positions_, T, H_, D_, cosb, sinb, false);
    ops_->rope_apply(k, positions_, T, Hkv_, D_, cosb, sinb, false);
    ops_->attention_forward(Attn(l), q, k, v, cu_, nseq_, T, attn,
                            lse_ + lt * H_);
    mem_->CopyOnDevice(xmid, x, TC * sizeof(float));
    ops_->matmul(false, true, T, C_, HD_, 1.f, attn, HD_, P + o.o, HD_, 1.f, xmid, C_);
    ops_->rmsnorm_forward(xmid, P + o.post_norm, T, C_, eps, xn_, rstd2_ + lt);
    ops_->matmul(false, true, T, I_, C_, 1.f, xn_, C_, P + o.gate, C_, 0.f, gate, I_);
    ops_->matmul(false, true, T, I_, C_, 1.f, xn_, C_, P + o.up, C_, 0.f, up, I_);
    ops_->swiglu_forward(gate, up, static_cast<size_t>(T) * I_, hact_);
    mem_->CopyOnDevice(xo, xmid, TC * sizeof(float));
    ops_->matmul(false, true, T, C_, I_, 1.f, hact_, I_, P + o.down, I_, 1.f, xo, C_);
    pp.ReleaseParams(unit);
  }
  const int fu = layout_.final_unit();
  const float* P = pp.AcquireParams(fu);
  if (layout_.tied()) pp.Prefetch(0);  // the LM head comes next
  ops_->rmsnorm_forward(x_ + L_ * TC, P + layout_.final_norm_offset(), T, C_,
                        eps, xnf_, rstdf_);
  pp.ReleaseParams(fu);
}

absl::Status Model::ForwardLogprobs(const Batch& batch, ParamProvider& pp,
                                    float* logp, float* entropy,
                                    const ForwardOptions& options) {
  absl::Status s = Prepare(batch);
  if (!s.ok()) return s;
  if (!options.recompute_mlp) {
    s = EnsureMlpStore(T_);
    if (!s.ok()) return s;
  }
  recomputed_mlp_ = options.recompute_mlp;
  ForwardHidden(pp, options.recompute_mlp);
  const int hu = layout_.lm_head_unit();
  const float* P = pp.AcquireParams(hu);
  ops_->lm_head_logprobs_forward(xnf_, P + layout_.lm_head_offset(), targets_,
                                 T_, C_, V_, lm_chunk_, lm_scratch_, logp_,
                                 entropy != nullptr ? entropy_ : nullptr);
  pp.ReleaseParams(hu);
  mem_->CopyToHost(logp, logp_, static_cast<size_t>(T_) * sizeof(float));
  if (entropy != nullptr) {
    mem_->CopyToHost(entropy, entropy_, static_cast<size_t>(T_) * sizeof(float));
  }
  s = MemoryStatus();
  if (!s.ok()) return s;
  have_forward_ = true;
  return absl::OkStatus();
}

absl::Status Model::ForwardLogits(const Batch& batch, ParamProvider& pp,
                                  float* logits) {
  absl::Status s = Prepare(batch);
  if (!s.ok()) return s;
  const size_t n = static_cast<size_t>(T_) * V_;
  kernels::DeviceArray<float> out;
  if (!out.Allocate(mem_, n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "model: cannot allocate ", n * sizeof(float), " bytes of logits"));
  }
  ForwardHidden(pp, /*recompute_mlp=*/true);  // nothing is kept for a backward
  const int hu = layout_.lm_head_unit();
  const float* P = pp.AcquireParams(hu);
  ops_->matmul(false, true, T_, V_, C_, 1.f, xnf_, C_,
               P + layout_.lm_head_offset(), C_, 0.f, out.data(), V_);
  pp.ReleaseParams(hu);
  out.Download(logits, n);
  return MemoryStatus();
}

absl::Status Model::Backward(const float* dlogp, ParamProvider& pp,
                             const BackwardOptions& options) {
  if (!have_forward_) {
    return absl::FailedPreconditionError("Backward without a ForwardLogprobs");
  }
  have_forward_ = false;
  const int T = T_;
  const size_t TC = static_cast<size_t>(T) * C_;
  const size_t TI = static_cast<size_t>(T) * I_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float* cosb = cos_d_.data();
  const float* sinb = sin_d_.data();
  const int fu = layout_.final_unit();
  const bool tied = layout_.tied();
  const bool recompute = recomputed_mlp_;
  const int rank = std::min(options.low_rank, C_);
  if (rank > 0) {
    if (absl::Status s = EnsureLowRank(T, rank); !s.ok()) return s;
  }
  mem_->CopyToDevice(dlogp_, dlogp, static_cast<size_t>(T) * sizeof(float));

  // LM head and final norm.
  const float* Pf = pp.AcquireParams(fu);
  float* Gf = pp.AcquireGrads(fu);
  pp.Prefetch(layout_.layer_unit(L_ - 1));
  const float* Ph = tied ? pp.AcquireParams(0) : Pf;
  float* Gh = tied ? pp.AcquireGrads(0) : Gf;
  ops_->lm_head_logprobs_backward(xnf_, Ph + layout_.lm_head_offset(),
                                  targets_, dlogp_, T, C_, V_, lm_chunk_,
                                  lm_scratch_, dxn_, Gh + layout_.lm_head_offset());
  if (tied) pp.ReleaseParams(0);
  ops_->rmsnorm_backward(dxn_, x_ + L_ * TC, Pf + layout_.final_norm_offset(),
                         rstdf_, T, C_, dres_, Gf + layout_.final_norm_offset());
  pp.ReleaseGrads(fu);
  pp.ReleaseParams(fu);

  for (int l = L_ - 1; l >= 0; --l) {
    const int unit = layout_.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    float* G = pp.AcquireGrads(unit);
    pp.Prefetch(unit - 1);
    const LayerOffsets& o = layout_.layer(l);
    const size_t lt = static_cast<size_t>(l) * T;
    const float* x = x_ + l * TC;
    const float* xmid = xmid_ + l * TC;
    const float* q = q_ + lt * HD_;
    const float* k = k_ + lt * KD_;
    const float* v = v_ + lt * KD_;
    const float* attn = attn_ + lt * HD_;
    // MLP: recompute xn2 and the SwiGLU output (and, when the forward kept
    // no MLP activations, its inputs: the forward's very calls, so the same
    // bits).
    ops_->rmsnorm_forward(xmid, P + o.post_norm, T, C_, eps, xn_, rstd_tmp_);
    const float* gate = recompute ? nullptr : gate_ + lt * I_;
    const float* up = recompute ? nullptr : up_ + lt * I_;
    float* dgate = dgate_;
    float* dup = dup_;
    if (recompute) {
      ops_->matmul(false, true, T, I_, C_, 1.f, xn_, C_, P + o.gate, C_, 0.f, dgate_, I_);
      ops_->matmul(false, true, T, I_, C_, 1.f, xn_, C_, P + o.up, C_, 0.f, dup_, I_);
      gate = dgate_;
      up = dup_;
      dgate = hact_;  // free once the down projection's gradient is taken
      dup = dup2_;
    }
    ops_->swiglu_forward(gate, up, TI, hact_);
    ops_->matmul(false, false, T, I_, C_, 1.f, dres_, C_, P + o.down, I_, 0.f, dh_, I_);
    if (rank > 0) {
      // dW_down ~ P (dres P)^T hact: a = dres P [T, r], b = a^T hact [r, I].
      MakeProjection(options.low_rank_seed, l, rank);
      ops_->matmul(false, false, T, rank, C_, 1.f, dres_, C_, lr_p_, rank, 0.f, lr_a_, rank);
      ops_->matmul(true, false, rank, I_, T, 1.f, lr_a_, rank, hact_, I_, 0.f, lr_b_, I_);
      ops_->matmul(false, false, C_, I_, rank, 1.f, lr_p_, rank, lr_b_, I_, 1.f, G + o.down, I_);
    } else {
      ops_->matmul(true, false, C_, I_, T, 1.f, dres_, C_, hact_, I_, 1.f, G + o.down, I_);
    }
    ops_->swiglu_backward(dh_, gate, up, TI, dgate, dup);
    ops_->matmul(false, false, T, C_, I_, 1.f, dgate, I_, P + o.gate, C_, 0.f, dxn_, C_);
    ops_->matmul(false, false, T, C_, I_, 1.f, dup, I_, P + o.up, C_, 1.f, dxn_, C_);
    if (rank > 0) {
      // dW_gate ~ (dgate^T (xn P)) P^T: a = xn P [T, r], b = dgate^T a [I, r].
      ops_->matmul(false, false, T, rank, C_, 1.f, xn_, C_, lr_p_, rank, 0.f, lr_a_, rank);
      ops_->matmul(true, false, I_, rank, T, 1.f, dgate, I_, lr_a_, rank, 0.f, lr_b_, rank);
      ops_->matmul(false, true, I_, C_, rank, 1.f, lr_b_, rank, lr_p_, rank, 1.f, G + o.gate, C_);
      ops_->matmul(true, false, I_, rank, T, 1.f, dup, I_, lr_a_, rank, 0.f, lr_b_, rank);
      ops_->matmul(false, true, I_, C_, rank, 1.f, lr_b_, rank, lr_p_, rank, 1.f, G + o.up, C_);
    } else {
      ops_->matmul(true, false, I_, C_, T, 1.f, dgate, I_, xn_, C_, 1.f, G + o.gate, C_);
      ops_->matmul(true, false, I_, C_, T, 1.f, dup, I_, xn_, C_, 1.f, G + o.up, C_);
    }
    ops_->rmsnorm_backward(dxn_, xmid, P + o.post_norm, rstd2_ + lt, T, C_,
                           dtmp_, G + o.post_norm);
    ops_->add_inplace(dres_, dtmp_, TC);
    if (options.skip_attention) {  // the residual carries dres_ through
      pp.ReleaseGrads(unit);
      pp.ReleaseParams(unit);
      continue;
    }

    // Attention.
    ops_->matmul(false, false, T, HD_, C_, 1.f, dres_, C_, P + o.o, HD_, 0.f, dattn_, HD_);
    ops_->matmul(true, false, C_, HD_, T, 1.f, dres_, C_, attn, HD_, 1.f, G + o.o, HD_);
    ops_->attention_backward(Attn(l), q, k, v, attn, dattn_, lse_ + lt * H_,
                             cu_, nseq_, T, dq_, dk_, dv_);
    ops_->rope_apply(dq_, positions_, T, H_, D_, cosb, sinb, true);
    ops_->rope_apply(dk_, positions_, T, Hkv_, D_, cosb, sinb, true);
    ops_->rmsnorm_forward(x, P + o.input_norm, T, C_, eps, xn_, rstd_tmp_);
    // Gradients of the projections' outputs (before the q/k norms).
    const float* dqp = dq_;
    const float* dkp = dk_;
    if (qk_norm_) {
      // The norms' inputs, projected again from xn_ (v is not needed).
      ProjectQkv(P, o, T, qraw_, kraw_, nullptr);
      ops_->rmsnorm_backward(dq_, qraw_, P + o.q_norm, rstdq_ + lt * H_, T * H_, D_,
                             dqraw_, G + o.q_norm);
      ops_->rmsnorm_backward(dk_, kraw_, P + o.k_norm, rstdk_ + lt * Hkv_, T * Hkv_, D_,
                             dkraw_, G + o.k_norm);
      dqp = dqraw_;
      dkp = dkraw_;
    }
    if (o.q_bias != SIZE_MAX) {
      ops_->bias_backward(dqp, T, HD_, G + o.q_bias);
      ops_->bias_backward(dkp, T, KD_, G + o.k_bias);
      ops_->bias_backward(dv_, T, KD_, G + o.v_bias);
    }
    ops_->matmul(false, false, T, C_, HD_, 1.f, dqp, HD_, P + o.q, C_, 0.f, dxn_, C_);
    ops_->matmul(false, false, T, C_, KD_, 1.f, dkp, KD_, P + o.k, C_, 1.f, dxn_, C_);
    ops_->matmul(false, false, T, C_, KD_, 1.f, dv_, KD_, P + o.v, C_, 1.f, dxn_, C_);
    ops_->matmul(true, false, HD_, C_, T, 1.f, dqp, HD_, xn_, C_, 1.f, G + o.q, C_);
    ops_->matmul(true, false, KD_, C_, T, 1.f, dkp, KD_, xn_, C_, 1.f, G + o.k, C_);
    ops_->matmul(true, false, KD_, C_, T, 1.f, dv_, KD_, xn_, C_, 1.f, G + o.v, C_);
    ops_->rmsnorm_backward(dxn_, x, P + o.input_norm, rstd1_ + lt, T, C_,
                           dtmp_, G + o.input_norm);
    ops_->add_inplace(dres_, dtmp_, TC);
    pp.ReleaseGrads(unit);
    pp.ReleaseParams(unit);
  }

  float* G0 = pp.AcquireGrads(0);
  ops_->embedding_backward(tokens_, T, dres_, C_, G0 + layout_.embed_offset());
  if (tied) pp.ReleaseGrads(0);  // the hold taken for the LM head
  pp.ReleaseGrads(0);
  return MemoryStatus();
}

void Model::InitParams(uint64_t seed, float* params) const {
  std::fill(params, params + layout_.total_floats(), 0.f);
  std::mt19937_64 rng(seed);
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kStd = 0.02;  // HF initializer_range
  auto uniform = [&rng]() {  // (0, 1]
    return (static_cast<double>(rng() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  };
  for (const TensorView& t : layout_.tensors()) {
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
}

float SftLoss(std::span<const float> logp, std::span<const float> mask,
              float* dlogp) {
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
