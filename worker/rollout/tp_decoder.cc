// Tensor-parallel rollout forward with the two-half overlap (tp_decoder.h).
#include "worker/rollout/tp_decoder.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status_macros.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::rollout {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

absl::StatusOr<std::unique_ptr<TpDecoder>> TpDecoder::Create(const model::ModelConfig& config, comm::Collective* group,
                                                             kernels::Ops* ops, kernels::DeviceMemory* memory,
                                                             TpOptions options) {
  const int tp = group == nullptr ? 1 : group->size();
  ASSIGN_OR_RETURN(model::ModelConfig slice, TpSliceConfig(config, tp));
  if (options.overlap_min_rows < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollout: overlap_min_rows ", options.overlap_min_rows, " must be >= 2 (two halves)"));
  }
  if (options.shift && options.shift_threshold_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rollout.shift_threshold_tokens ", options.shift_threshold_tokens,
                                                   " must be >= 1 (rows of a step that runs sequence-parallel)"));
  }
  return std::unique_ptr<TpDecoder>(new TpDecoder(config, slice, group, ops, memory, options));
}

TpDecoder::TpDecoder(const model::ModelConfig& config, const model::ModelConfig& slice_config, comm::Collective* group,
                     kernels::Ops* ops, kernels::DeviceMemory* memory, TpOptions options)
    : decoder_(slice_config, ops, memory),
      full_layout_(config),
      full_dims_(config),
      ops_(ops),
      group_(group),
      options_(options) {
  if (group_ != nullptr && group_->size() > 1 && options_.overlap) {
    async_ = std::make_unique<AsyncAllreduce>(group_);
  }
  decoder_.set_first_head(tp_rank() * decoder_.dims().H);
}

size_t TpDecoder::linear_state_floats() const {
  if (!decoder_.has_linear_layers()) return 0;
  const model::DecoderDims& d = decoder_.dims();
  return static_cast<size_t>(d.H) * d.D * d.D;
}

absl::Status TpDecoder::Reserve(int rows, int outs, int positions) {
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
                                                                    {&part_, d.C},
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
  if (options_.shift && tp_size() > 1 && rows > shift_cap_) {
    size_t bytes = 0;
    if (!ReserveShift(rows, &bytes)) {
      Release();
      return absl::ResourceExhaustedError(absl::StrCat("rollout: cannot allocate ", bytes,
                                                       " bytes of sequence-parallel activations in ", mem->name(),
                                                       " memory; lower rollout.max_batch_tokens"));
    }
    shift_cap_ = rows;
  }
  if (outs > out_cap_) {
    // A step has at most one run per running sequence, at most `outs`
    // sequences run, and a half holds at most as many runs as the step.
    const size_t runs = static_cast<size_t>(outs) + 1;
    for (int h = 0; h < 2; ++h) {
      half_rows_[h].reserve(runs);
      half_slot_[h].reserve(runs);
      half_start_[h].reserve(runs);
    }
    const bool linear = decoder_.has_linear_layers();
    if (!hn_.Allocate(mem, static_cast<size_t>(outs) * d.C) ||
        !logits_.Allocate(mem, static_cast<size_t>(outs) * d.V) ||
        !state_.Allocate(mem, static_cast<size_t>(outs) * linear_state_floats()) ||
        !half_rows_d_.Allocate(mem, linear ? 2 * runs : 0)) {
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
  if (absl::Status st = decoder_.EnsureLinearDecay(std::max(rows_cap_, shift_cap_)); !st.ok()) {
    Release();
    return st;
  }
  return decoder_.MemoryStatus("rollout");
}

void TpDecoder::Release() {
  for (auto* a : {&x_, &xn_,   &q_,  &qraw_,   &k_,       &kraw_,    &v_,       &attn_,    &rstd_,  &gate_, &up_,
                  &h_, &part_, &hn_, &logits_, &sp_send_, &sp_recv_, &sp_attn_, &sp_gate_, &sp_up_, &sp_h_, &state_}) {
    a->reset();
  }
  half_rows_d_.reset();
  rows_cap_ = out_cap_ = shift_cap_ = 0;
  decoder_.ReleaseRope();
}

size_t TpDecoder::scratch_bytes() const {
  size_t n = 0;
  for (const auto* a :
       {&x_, &xn_,   &q_,  &qraw_,   &k_,       &kraw_,    &v_,       &attn_,    &rstd_,  &gate_, &up_,
        &h_, &part_, &hn_, &logits_, &sp_send_, &sp_recv_, &sp_attn_, &sp_gate_, &sp_up_, &sp_h_, &state_}) {
    n += a->bytes();
  }
  return n + half_rows_d_.bytes() + decoder_.rope_bytes();
}

void TpDecoder::AttnPart(const float* P, int l, KvPool& kv, const ForwardBatch& b, int r0, int n) {
  const model::DecoderDims& d = decoder_.dims();
  const int C = d.C, HD = d.HD, KD = d.KD;
  const model::LayerOffsets& o = decoder_.layout().layer(l);
  const size_t r = r0;
  const bool qk_norm = o.q_norm != SIZE_MAX;
  float* qp = (qk_norm ? qraw_.data() : q_.data()) + r * HD;
  float* kp = (qk_norm ? kraw_.data() : k_.data()) + r * KD;
  float* v = v_.data() + r * KD;
  decoder_.ProjectQkv(P, o, n, xn_.data() + r * C, qp, kp, v);
  Attend(qk_norm ? P + o.q_norm : nullptr, qk_norm ? P + o.k_norm : nullptr, l, kv, b, r0, n);
  ops_->matmul(false, true, n, C, HD, 1.f, attn_.data() + r * HD, HD, P + o.o, HD, 0.f, part_.data() + r * C, C);
}

void TpDecoder::Attend(const float* q_norm, const float* k_norm, int l, KvPool& kv, const ForwardBatch& b, int r0,
                       int n) {
  const model::DecoderDims& d = decoder_.dims();
  const int H = d.H, Hkv = d.Hkv, D = d.D, HD = d.HD, KD = d.KD;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  const size_t r = r0;
  float* q = q_.data() + r * HD;
  float* k = k_.data() + r * KD;
  float* v = v_.data() + r * KD;
  if (q_norm != nullptr) {
    ops_->rmsnorm_forward(qraw_.data() + r * HD, q_norm, n * H, D, eps, q, rstd_.data() + r * H);
    ops_->rmsnorm_forward(kraw_.data() + r * KD, k_norm, n * Hkv, D, eps, k, rstd_.data() + r * H);
  }
  const int32_t* pos = b.positions + r0;
  ops_->rope_apply(q, pos, n, H, D, decoder_.rope_cos(), decoder_.rope_sin(), false);
  ops_->rope_apply(k, pos, n, Hkv, D, decoder_.rope_cos(), decoder_.rope_sin(), false);
  float* attn = attn_.data() + r * HD;
  if (decoder_.layer_type(l).kind == model::LayerKind::kLinear) {
    TANDEM_CHECK(kv.state_floats() == linear_state_floats());
    RunLinearAttention(ops_, decoder_.memory(), decoder_.LinearAttention(), q, k, v, decoder_.LinearDecay(n), n,
                       RunsFor(b, r0, n), kv.States(l), kv.state_floats(), state_.data(), attn);
    return;
  }
  const int pool = kv.pool(l);
  const kernels::PagedKv pk = kv.Layer(l, b.tables_of(pool), b.max_blocks);
  ops_->paged_kv_write(pk, KD, k, v, b.slots_of(pool) + r0, n);
  // This rank's heads; sparse blocks are chosen per query head, as at TP 1.
  const kernels::AttentionParams ap = decoder_.Attention(l);
  if (b.sparse != nullptr && decoder_.layer_type(l).kind == model::LayerKind::kFull && ap.window <= 0) {
    float* summaries = kv.Summaries(l);
    ops_->paged_key_summaries(ap, pk, b.slots_of(pool) + r0, n, summaries);
    ops_->paged_sparse_attention(ap, *b.sparse, pk, summaries, q, b.row_seq + r0, pos, n, attn);
  } else {
    ops_->paged_attention(ap, pk, q, b.row_seq + r0, pos, n, attn);
  }
}

LinearRuns TpDecoder::RunsFor(const ForwardBatch& b, int r0, int n) const {
  if (r0 == 0 && n == b.rows) return RunsOf(b);
  TANDEM_CHECK(half_r0_ >= 0 && (r0 == 0 || r0 == half_r0_));
  const int h = r0 == 0 ? 0 : 1;
  return {half_num_[h], half_rows_d_.data() + h * (half_rows_d_.size() / 2), half_slot_[h].data(),
          half_start_[h].data()};
}

void TpDecoder::SplitRuns(const ForwardBatch& b, int m) {
  half_r0_ = m;
  half_num_[0] = SliceRuns(b, 0, m, &half_rows_[0], &half_slot_[0], &half_start_[0]);
  half_num_[1] = SliceRuns(b, m, b.rows - m, &half_rows_[1], &half_slot_[1], &half_start_[1]);
  const size_t stride = half_rows_d_.size() / 2;
  TANDEM_CHECK(half_rows_[0].size() <= stride && half_rows_[1].size() <= stride);
  half_rows_d_.Upload(half_rows_[0].data(), half_rows_[0].size());
  half_rows_d_.Upload(half_rows_[1].data(), half_rows_[1].size(), stride);
}

void TpDecoder::MlpPart(const float* P, int l, int r0, int n) {
  const model::DecoderDims& d = decoder_.dims();
  const int C = d.C, I = d.I;
  const model::LayerOffsets& o = decoder_.layout().layer(l);
  const size_t r = r0;
  const float* xn = xn_.data() + r * C;
  float* gate = gate_.data() + r * I;
  float* up = up_.data() + r * I;
  float* h = h_.data() + r * I;
  ops_->matmul(false, true, n, I, C, 1.f, xn, C, P + o.gate, C, 0.f, gate, I);
  ops_->matmul(false, true, n, I, C, 1.f, xn, C, P + o.up, C, 0.f, up, I);
  ops_->swiglu_forward(gate, up, static_cast<size_t>(n) * I, h);
  ops_->matmul(false, true, n, C, I, 1.f, h, I, P + o.down, I, 0.f, part_.data() + r * C, C);
}

void TpDecoder::Finish(int r0, int n, const float* norm) {
  const int C = decoder_.dims().C;
  const size_t r = r0;
  float* x = x_.data() + r * C;
  ops_->add_inplace(x, part_.data() + r * C, static_cast<size_t>(n) * C);
  if (norm != nullptr) {
    ops_->rmsnorm_forward(x, norm, n, C, static_cast<float>(decoder_.config().rms_norm_eps), xn_.data() + r * C,
                          rstd_.data() + r);
  }
}

absl::Status TpDecoder::ReduceNow(int r0, int n) {
  if (tp_size() == 1) return absl::OkStatus();
  const size_t count = static_cast<size_t>(n) * decoder_.dims().C;
  const double t0 = Now();
  absl::Status st = group_->allreduce(part_.data() + static_cast<size_t>(r0) * decoder_.dims().C, count,
                                      comm::ReduceOp::kSum, options_.timeout);
  const double dt = Now() - t0;
  stats_.allreduce_seconds += dt;
  stats_.exposed_seconds += dt;
  ++stats_.allreduces;
  stats_.allreduce_bytes += count * sizeof(float);
  return st;
}

void TpDecoder::ReduceStart(int r0, int n) {
  const size_t count = static_cast<size_t>(n) * decoder_.dims().C;
  async_->Start(part_.data() + static_cast<size_t>(r0) * decoder_.dims().C, count, options_.timeout);
  ++stats_.allreduces;
  stats_.allreduce_bytes += count * sizeof(float);
}

absl::Status TpDecoder::ReduceWait() {
  const double t0 = Now();
  absl::Status st = async_->Wait();
  stats_.exposed_seconds += Now() - t0;
  return st;
}

// One block at a time over all rows: compute, all-reduce, finish.
absl::Status TpDecoder::Layers(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b) {
  const model::ParamLayout& layout = decoder_.layout();
  const int L = decoder_.dims().L, T = b.rows, C = decoder_.dims().C;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  for (int l = 0; l < L; ++l) {
    const model::LayerOffsets& o = layout.layer(l);
    const int unit = layout.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    absl::Status st;
    if (l == 0) {
      ops_->rmsnorm_forward(x_.data(), P + o.input_norm, T, C, eps, xn_.data(), rstd_.data());
    } else {
      st = ReduceNow(0, T);  // the previous layer's MLP
      if (st.ok()) Finish(0, T, P + o.input_norm);
    }
    if (st.ok()) {
      AttnPart(P, l, kv, b, 0, T);
      st = ReduceNow(0, T);
    }
    if (st.ok()) {
      Finish(0, T, P + o.post_norm);
      MlpPart(P, l, 0, T);
    }
    pp.ReleaseParams(unit);
    RETURN_IF_ERROR(st);
  }
  RETURN_IF_ERROR(ReduceNow(0, T));
  Finish(0, T, nullptr);
  return absl::OkStatus();
}

// Halves A = [0, m) and B = [m, T). Exactly one all-reduce is in flight at
// a time; each overlaps the other half's next block:
//   [layer > 0: wait A(mlp); finish A; start B(mlp)]  attn A
//   [layer > 0: wait B(mlp); finish B]  start A(attn)  attn B
//   wait A; finish A; start B(attn)  mlp A
//   wait B; finish B; start A(mlp)   mlp B
// and after the last layer: wait A; finish A; B(mlp) on this thread.
absl::Status TpDecoder::LayersOverlapped(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b) {
  const model::ParamLayout& layout = decoder_.layout();
  const int L = decoder_.dims().L, T = b.rows, C = decoder_.dims().C;
  const int m = T / 2, nb = T - m;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  absl::Status st;
  for (int l = 0; l < L && st.ok(); ++l) {
    const model::LayerOffsets& o = layout.layer(l);
    const int unit = layout.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    if (l == 0) {
      ops_->rmsnorm_forward(x_.data(), P + o.input_norm, T, C, eps, xn_.data(), rstd_.data());
    } else {
      st = ReduceWait();
      if (st.ok()) {
        Finish(0, m, P + o.input_norm);
        ReduceStart(m, nb);
      }
    }
    if (st.ok()) {
      AttnPart(P, l, kv, b, 0, m);
      if (l > 0) {
        st = ReduceWait();
        if (st.ok()) Finish(m, nb, P + o.input_norm);
      }
    }
    if (st.ok()) {
      ReduceStart(0, m);
      AttnPart(P, l, kv, b, m, nb);
      st = ReduceWait();
    }
    if (st.ok()) {
      Finish(0, m, P + o.post_norm);
      ReduceStart(m, nb);
      MlpPart(P, l, 0, m);
      st = ReduceWait();
    }
    if (st.ok()) {
      Finish(m, nb, P + o.post_norm);
      ReduceStart(0, m);
      MlpPart(P, l, m, nb);
    }
    pp.ReleaseParams(unit);
  }
  if (st.ok()) st = ReduceWait();
  if (st.ok()) {
    Finish(0, m, nullptr);
    st = ReduceNow(m, nb);
  }
  if (st.ok()) Finish(m, nb, nullptr);
  if (!st.ok()) (void)async_->Wait();  // nothing may touch part_ after return
  return st;
}

absl::Status TpDecoder::Forward(model::ParamProvider& pp, KvPool& kv, const ForwardBatch& b) {
  TANDEM_CHECK(b.rows > 0 && b.rows <= rows_cap_ && b.num_out <= out_cap_);
  const double t0 = Now();
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
  if (ShiftStep(b.rows)) {
    if (full_ == nullptr) {
      return absl::FailedPreconditionError(
          "rollout: a sequence-parallel step needs the full model's parameters (TpDecoder::SetFullParams)");
    }
    RETURN_IF_ERROR(LayersShifted(*full_, kv, b));
    ++stats_.sp_steps;
    stats_.sp_rows += b.rows;
  } else {
    const double busy0 = async_ != nullptr ? async_->busy_seconds() : 0;
    const bool overlap = async_ != nullptr && b.rows >= options_.overlap_min_rows;
    if (overlap && decoder_.has_linear_layers()) SplitRuns(b, b.rows / 2);
    absl::Status st = overlap ? LayersOverlapped(pp, kv, b) : Layers(pp, kv, b);
    if (async_ != nullptr) stats_.allreduce_seconds += async_->busy_seconds() - busy0;
    RETURN_IF_ERROR(st);
    ++stats_.tp_steps;
    stats_.tp_rows += b.rows;
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
  ++stats_.forwards;
  stats_.forward_seconds += Now() - t0;
  return decoder_.MemoryStatus("rollout");
}

}  // namespace tandem::rollout
