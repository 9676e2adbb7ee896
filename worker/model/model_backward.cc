// Model's backward: the LM head and final norm, each decoder layer (with
// activation checkpointing's recomputation, the optional low-rank and
// skip-attention options, and sequence-parallel attention), then the
// embedding. Backward runs the pieces in order; layer-major accumulation
// (layer_major.h) interleaves them across micro-batches.
#include <algorithm>

#include "common/base/status_macros.h"
#include "worker/model/model.h"

namespace tandem::model {

absl::Status Model::Backward(const float* dlogp, ParamProvider& pp, const BackwardOptions& options) {
  RETURN_IF_ERROR(BackwardPrepare(dlogp, options));
  BackwardHead(pp);
  for (int l = d_.L - 1; l >= 0; --l) BackwardLayer(l, pp);
  return BackwardEmbedding(pp);
}

absl::Status Model::BackwardPrepare(const float* dlogp, const BackwardOptions& options) {
  if (!have_forward_) {
    return absl::FailedPreconditionError("Backward without a ForwardLogprobs");
  }
  have_forward_ = false;
  bw_options_ = options;
  bw_rank_ = std::min(options.low_rank, d_.C);
  if (bw_rank_ > 0) RETURN_IF_ERROR(EnsureLowRank(T_, bw_rank_));
  mem_->CopyToDevice(dlogp_, dlogp, static_cast<size_t>(T_) * sizeof(float));
  return absl::OkStatus();
}

void Model::BackwardHead(ParamProvider& pp) {
  const int C = d_.C, V = d_.V;
  const int T = T_;
  const int fu = layout().final_unit();
  const bool tied = layout().tied();

  // LM head and final norm.
  const float* Pf = pp.AcquireParams(fu);
  float* Gf = pp.AcquireGrads(fu);
  pp.Prefetch(layout().layer_unit(d_.L - 1));
  const float* Ph = tied ? pp.AcquireParams(0) : Pf;
  float* Gh = tied ? pp.AcquireGrads(0) : Gf;
  ops_->lm_head_logprobs_backward(xnf_, Ph + layout().lm_head_offset(), targets_, dlogp_, T, C, V, lm_chunk_,
                                  lm_scratch_, dxn_, Gh + layout().lm_head_offset());
  if (tied) pp.ReleaseParams(0);
  ops_->rmsnorm_backward(dxn_, x_ + d_.L * static_cast<size_t>(T) * C, Pf + layout().final_norm_offset(), rstdf_, T, C,
                         dres_, Gf + layout().final_norm_offset());
  pp.ReleaseGrads(fu);
  pp.ReleaseParams(fu);
}

void Model::BackwardLayer(int l, ParamProvider& pp) {
  if (!sp_status_.ok()) return;  // a sequence-parallel layer failed
  const int C = d_.C, H = d_.H, Hkv = d_.Hkv, D = d_.D, I = d_.I;
  const int HD = d_.HD, KD = d_.KD;
  const int T = T_;
  const size_t TC = static_cast<size_t>(T) * C;
  const size_t TI = static_cast<size_t>(T) * I;
  const float eps = static_cast<float>(config().rms_norm_eps);
  const float* cosb = decoder_.rope_cos();
  const float* sinb = decoder_.rope_sin();
  const bool recompute = recomputed_mlp_;
  const int rank = bw_rank_;
  const BackwardOptions& options = bw_options_;
  const DecoderActivations acts = Activations(recompute);
  const DecoderInput in = Input();
  const int unit = layout().layer_unit(l);
  const float* P = pp.AcquireParams(unit);
  float* G = pp.AcquireGrads(unit);
  pp.Prefetch(unit - 1);
  const LayerOffsets& o = layout().layer(l);
  const size_t lt = static_cast<size_t>(l) * T;
  // The layer's activations: stored, or (checkpointing) recomputed into
  // one layer's slot below, with the forward's calls.
  const float* x = acts.x.at(l);
  const float* xmid = acts.xmid.at(l);
  const float* q = acts.q.at(l);
  const float* k = acts.k.at(l);
  const float* v = acts.v.at(l);
  const float* attn = acts.attn.at(l);
  if (ckpt_ == ActivationCheckpointing::kLayer) {
    decoder_.RecomputeLayer(P, l, in, acts, Decoder::LayerPart::kAttentionBlock);
  }
  // MLP: recompute xn2 and the SwiGLU output (and, when the forward kept
  // no MLP activations, its inputs: the forward's very calls, so the same
  // bits). rstd_tmp_ is then the forward's post-norm rstd.
  ops_->rmsnorm_forward(xmid, P + o.post_norm, T, C, eps, xn_, rstd_tmp_);
  const float* rstd_post = keep_mid_ ? acts.rstd_post.at(l) : rstd_tmp_;
  const float* gate = recompute ? nullptr : gate_ + lt * I;
  const float* up = recompute ? nullptr : up_ + lt * I;
  float* dgate = dgate_;
  float* dup = dup_;
  if (recompute) {
    ops_->matmul(false, true, T, I, C, 1.f, xn_, C, P + o.gate, C, 0.f, dgate_, I);
    ops_->matmul(false, true, T, I, C, 1.f, xn_, C, P + o.up, C, 0.f, dup_, I);
    gate = dgate_;
    up = dup_;
    dgate = hact_;  // free once the down projection's gradient is taken
    dup = dup2_;
  }
  ops_->swiglu_forward(gate, up, TI, hact_);
  ops_->matmul(false, false, T, I, C, 1.f, dres_, C, P + o.down, I, 0.f, dh_, I);
  if (rank > 0) {
    // dW_down ~ P (dres P)^T hact: a = dres P [T, r], b = a^T hact [r, I].
    MakeProjection(options.low_rank_seed, l, rank);
    ops_->matmul(false, false, T, rank, C, 1.f, dres_, C, lr_p_, rank, 0.f, lr_a_, rank);
    ops_->matmul(true, false, rank, I, T, 1.f, lr_a_, rank, hact_, I, 0.f, lr_b_, I);
    ops_->matmul(false, false, C, I, rank, 1.f, lr_p_, rank, lr_b_, I, 1.f, G + o.down, I);
  } else {
    ops_->matmul(true, false, C, I, T, 1.f, dres_, C, hact_, I, 1.f, G + o.down, I);
  }
  ops_->swiglu_backward(dh_, gate, up, TI, dgate, dup);
  ops_->matmul(false, false, T, C, I, 1.f, dgate, I, P + o.gate, C, 0.f, dxn_, C);
  ops_->matmul(false, false, T, C, I, 1.f, dup, I, P + o.up, C, 1.f, dxn_, C);
  if (rank > 0) {
    // dW_gate ~ (dgate^T (xn P)) P^T: a = xn P [T, r], b = dgate^T a [I, r].
    ops_->matmul(false, false, T, rank, C, 1.f, xn_, C, lr_p_, rank, 0.f, lr_a_, rank);
    ops_->matmul(true, false, I, rank, T, 1.f, dgate, I, lr_a_, rank, 0.f, lr_b_, rank);
    ops_->matmul(false, true, I, C, rank, 1.f, lr_b_, rank, lr_p_, rank, 1.f, G + o.gate, C);
    ops_->matmul(true, false, I, rank, T, 1.f, dup, I, lr_a_, rank, 0.f, lr_b_, rank);
    ops_->matmul(false, true, I, C, rank, 1.f, lr_b_, rank, lr_p_, rank, 1.f, G + o.up, C);
  } else {
    ops_->matmul(true, false, I, C, T, 1.f, dgate, I, xn_, C, 1.f, G + o.gate, C);
    ops_->matmul(true, false, I, C, T, 1.f, dup, I, xn_, C, 1.f, G + o.up, C);
  }
  ops_->rmsnorm_backward(dxn_, xmid, P + o.post_norm, rstd_post, T, C, dtmp_, G + o.post_norm);
  ops_->add_inplace(dres_, dtmp_, TC);
  if (options.skip_attention) {  // the residual carries dres_ through
    pp.ReleaseGrads(unit);
    pp.ReleaseParams(unit);
    return;
  }

  // Attention.
  if (ckpt_ == ActivationCheckpointing::kSelective) {
    decoder_.RecomputeLayer(P, l, in, acts, Decoder::LayerPart::kAttentionCore);
  }
  ops_->matmul(false, false, T, HD, C, 1.f, dres_, C, P + o.o, HD, 0.f, dattn_, HD);
  ops_->matmul(true, false, C, HD, T, 1.f, dres_, C, attn, HD, 1.f, G + o.o, HD);
  if (sliced_) {
    absl::Status st =
        decoder_.layer_type(l).kind == LayerKind::kLinear
            ? sp_->LinearBackward(decoder_.LinearAttention(), slice_, local_cu_.data(), nseq_, q, k, v,
                                  decoder_.LinearDecay(T), dattn_, dq_, dk_, dv_)
            : sp_->SoftmaxBackward(decoder_.Attention(l), slice_, q, k, v, attn, dattn_, acts.lse.at(l), dq_, dk_, dv_);
    if (!st.ok()) {
      pp.ReleaseGrads(unit);
      pp.ReleaseParams(unit);
      sp_status_ = st;  // BackwardEmbedding returns it
      return;
    }
  } else if (decoder_.layer_type(l).kind == LayerKind::kLinear) {
    ops_->linear_attention_backward(decoder_.LinearAttention(), q, k, v, decoder_.LinearDecay(T), cu_, nseq_, T,
                                    nullptr, dattn_, nullptr, dq_, dk_, dv_, nullptr, nullptr);
  } else {
    ops_->attention_backward(decoder_.Attention(l), q, k, v, attn, dattn_, acts.lse.at(l), cu_, nseq_, T, dq_, dk_,
                             dv_);
  }
  ops_->rope_apply(dq_, positions_, T, H, D, cosb, sinb, true);
  ops_->rope_apply(dk_, positions_, T, Hkv, D, cosb, sinb, true);
  ops_->rmsnorm_forward(x, P + o.input_norm, T, C, eps, xn_, rstd_tmp_);
  // Gradients of the projections' outputs (before the q/k norms).
  const float* dqp = dq_;
  const float* dkp = dk_;
  if (qk_norm_) {
    // The norms' inputs, projected again from xn_ (v is not needed).
    decoder_.ProjectQkv(P, o, T, xn_, qraw_, kraw_, nullptr);
    ops_->rmsnorm_backward(dq_, qraw_, P + o.q_norm, acts.rstd_q.at(l), T * H, D, dqraw_, G + o.q_norm);
    ops_->rmsnorm_backward(dk_, kraw_, P + o.k_norm, acts.rstd_k.at(l), T * Hkv, D, dkraw_, G + o.k_norm);
    dqp = dqraw_;
    dkp = dkraw_;
  }
  if (o.q_bias != SIZE_MAX) {
    ops_->bias_backward(dqp, T, HD, G + o.q_bias);
    ops_->bias_backward(dkp, T, KD, G + o.k_bias);
    ops_->bias_backward(dv_, T, KD, G + o.v_bias);
  }
  ops_->matmul(false, false, T, C, HD, 1.f, dqp, HD, P + o.q, C, 0.f, dxn_, C);
  ops_->matmul(false, false, T, C, KD, 1.f, dkp, KD, P + o.k, C, 1.f, dxn_, C);
  ops_->matmul(false, false, T, C, KD, 1.f, dv_, KD, P + o.v, C, 1.f, dxn_, C);
  ops_->matmul(true, false, HD, C, T, 1.f, dqp, HD, xn_, C, 1.f, G + o.q, C);
  ops_->matmul(true, false, KD, C, T, 1.f, dkp, KD, xn_, C, 1.f, G + o.k, C);
  ops_->matmul(true, false, KD, C, T, 1.f, dv_, KD, xn_, C, 1.f, G + o.v, C);
  ops_->rmsnorm_backward(dxn_, x, P + o.input_norm, acts.rstd_in.at(l), T, C, dtmp_, G + o.input_norm);
  ops_->add_inplace(dres_, dtmp_, TC);
  pp.ReleaseGrads(unit);
  pp.ReleaseParams(unit);
}

absl::Status Model::BackwardEmbedding(ParamProvider& pp) {
  float* G0 = pp.AcquireGrads(0);
  ops_->embedding_backward(tokens_, T_, dres_, d_.C, G0 + layout().embed_offset());
  if (layout().tied()) pp.ReleaseGrads(0);  // the hold taken for the LM head
  pp.ReleaseGrads(0);
  RETURN_IF_ERROR(sp_status_);
  return decoder_.MemoryStatus("model");
}

}  // namespace tandem::model
