// Sequence-parallel steps of the tensor-parallel rollout forward (Shift
// Parallelism; tp_decoder.h). Rank r owns rows [off_r, off_r + n_r) of the
// step (comm::SplitEven) and keeps them at those rows of x_/xn_/part_. Per
// layer, with T ranks, qw = H/T * D and kw = Hkv/T * D (a slice's widths):
//
//   xn = RMSNorm(x)                               own rows, full weights
//   send[t] = [xn Wq_t^T | xn Wk_t^T | xn Wv_t^T]  (n_r x (qw + 2 kw)) per rank t
//   all-to-all  ->  this rank's heads' q/k/v for every row of the step
//   q/k norms, RoPE, KV write, paged attention     this rank's heads, all rows
//   all-to-all  ->  own rows' attention output, head slice by head slice
//   x += sum_t attn_t Wo[:, t]^T ; MLP with the full weights ; x += down
//
// and after the last layer one all-gather of the residual rows. Wq_t are
// rows of Wq (heads are contiguous), so each destination's piece is one
// GEMM with no packing.
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/rollout/tp_decoder.h"

namespace tandem::rollout {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

bool TpDecoder::ReserveShift(int rows, size_t* bytes) {
  const model::DecoderDims& s = decoder_.dims();
  const model::DecoderDims& f = full_dims_;
  const int T = tp_size();
  const size_t own = (static_cast<size_t>(rows) + T - 1) / T;  // most rows one rank owns
  const size_t width = static_cast<size_t>(s.HD) + 2 * static_cast<size_t>(s.KD);
  const std::pair<kernels::DeviceArray<float>*, size_t> buffers[] = {
      {&sp_send_, own * T * width}, {&sp_recv_, static_cast<size_t>(rows) * width},
      {&sp_attn_, own * f.HD},      {&sp_gate_, own * f.I},
      {&sp_up_, own * f.I},         {&sp_h_, own * f.I}};
  bool ok = true;
  *bytes = 0;
  for (const auto& [a, count] : buffers) {
    ok = ok && a->Allocate(decoder_.memory(), count);
    *bytes += count * sizeof(float);
  }
  sp_rows_.reserve(T);
  sp_offs_.reserve(T);
  sp_send_counts_.reserve(T);
  sp_recv_counts_.reserve(T);
  return ok;
}

absl::Status TpDecoder::ShiftExchange(const float* in, const std::vector<size_t>& send, float* out,
                                      const std::vector<size_t>& recv) {
  const double t0 = Now();
  absl::Status st = group_->alltoall(in, send, out, recv, options_.timeout);
  stats_.sp_comm_seconds += Now() - t0;
  ++stats_.sp_collectives;
  const int me = tp_rank();
  for (int t = 0; t < tp_size(); ++t) {
    if (t != me) stats_.sp_bytes += (send[t] + recv[t]) * sizeof(float);
  }
  return st;
}

absl::Status TpDecoder::LayersShifted(model::ParamProvider& full, KvPool& kv, const ForwardBatch& b) {
  const model::DecoderDims& s = decoder_.dims();
  const model::DecoderDims& f = full_dims_;
  const int T = tp_size(), me = tp_rank(), rows = b.rows;
  const int C = f.C, I = f.I, HDf = f.HD;
  const int qw = s.HD, kw = s.KD, width = qw + 2 * kw;
  const float eps = static_cast<float>(decoder_.config().rms_norm_eps);
  // comm::SplitEven(rows, T), into reserved vectors.
  sp_rows_.assign(T, static_cast<size_t>(rows / T));
  for (int t = 0; t < rows % T; ++t) ++sp_rows_[t];
  sp_offs_.assign(T, 0);
  for (int t = 1; t < T; ++t) sp_offs_[t] = sp_offs_[t - 1] + sp_rows_[t - 1];
  const int n = static_cast<int>(sp_rows_[me]);
  const size_t off = sp_offs_[me];
  float* x = x_.data() + off * C;
  float* xn = xn_.data() + off * C;
  float* part = part_.data() + off * C;
  float* rstd = rstd_.data() + off;

  for (int l = 0; l < f.L; ++l) {
    const model::LayerOffsets& o = full_layout_.layer(l);
    const int unit = full_layout_.layer_unit(l);
    const bool qk_norm = o.q_norm != SIZE_MAX;
    float* qdst = qk_norm ? qraw_.data() : q_.data();
    float* kdst = qk_norm ? kraw_.data() : k_.data();
    const float* P = full.AcquireParams(unit);
    full.Prefetch(unit + 1);
    // Own rows: input norm and this rank's pieces of q/k/v for every rank.
    if (n > 0) {
      ops_->rmsnorm_forward(x, P + o.input_norm, n, C, eps, xn, rstd);
      for (int t = 0; t < T; ++t) {
        float* dst = sp_send_.data() + static_cast<size_t>(t) * n * width;
        float* dq = dst;
        float* dk = dq + static_cast<size_t>(n) * qw;
        float* dv = dk + static_cast<size_t>(n) * kw;
        ops_->matmul(false, true, n, qw, C, 1.f, xn, C, P + o.q + static_cast<size_t>(t) * qw * C, C, 0.f, dq, qw);
        ops_->matmul(false, true, n, kw, C, 1.f, xn, C, P + o.k + static_cast<size_t>(t) * kw * C, C, 0.f, dk, kw);
        ops_->matmul(false, true, n, kw, C, 1.f, xn, C, P + o.v + static_cast<size_t>(t) * kw * C, C, 0.f, dv, kw);
        if (o.q_bias != SIZE_MAX) {
          ops_->add_bias(dq, P + o.q_bias + static_cast<size_t>(t) * qw, n, qw);
          ops_->add_bias(dk, P + o.k_bias + static_cast<size_t>(t) * kw, n, kw);
          ops_->add_bias(dv, P + o.v_bias + static_cast<size_t>(t) * kw, n, kw);
        }
      }
    }
    sp_send_counts_.assign(T, static_cast<size_t>(n) * width);
    sp_recv_counts_.resize(T);
    for (int t = 0; t < T; ++t) sp_recv_counts_[t] = sp_rows_[t] * width;
    absl::Status st = ShiftExchange(sp_send_.data(), sp_send_counts_, sp_recv_.data(), sp_recv_counts_);
    if (st.ok()) {
      // Rank t's piece holds rows [off_t, off_t + n_t) of this rank's heads.
      kernels::DeviceMemory* mem = decoder_.memory();
      for (int t = 0; t < T; ++t) {
        const size_t nt = sp_rows_[t], ot = sp_offs_[t];
        if (nt == 0) continue;
        const float* src = sp_recv_.data() + ot * width;
        mem->CopyOnDevice(qdst + ot * qw, src, nt * qw * sizeof(float));
        mem->CopyOnDevice(kdst + ot * kw, src + nt * qw, nt * kw * sizeof(float));
        mem->CopyOnDevice(v_.data() + ot * kw, src + nt * (qw + kw), nt * kw * sizeof(float));
      }
      Attend(qk_norm ? P + o.q_norm : nullptr, qk_norm ? P + o.k_norm : nullptr, l, kv, b, 0, rows);
      // Every rank's rows of this rank's heads back to it.
      for (int t = 0; t < T; ++t) {
        sp_send_counts_[t] = sp_rows_[t] * qw;
        sp_recv_counts_[t] = static_cast<size_t>(n) * qw;
      }
      st = ShiftExchange(attn_.data(), sp_send_counts_, sp_attn_.data(), sp_recv_counts_);
    }
    if (st.ok() && n > 0) {
      for (int t = 0; t < T; ++t) {
        ops_->matmul(false, true, n, C, qw, 1.f, sp_attn_.data() + static_cast<size_t>(t) * n * qw, qw,
                     P + o.o + static_cast<size_t>(t) * qw, HDf, t == 0 ? 0.f : 1.f, part, C);
      }
      ops_->add_inplace(x, part, static_cast<size_t>(n) * C);
      ops_->rmsnorm_forward(x, P + o.post_norm, n, C, eps, xn, rstd);
      ops_->matmul(false, true, n, I, C, 1.f, xn, C, P + o.gate, C, 0.f, sp_gate_.data(), I);
      ops_->matmul(false, true, n, I, C, 1.f, xn, C, P + o.up, C, 0.f, sp_up_.data(), I);
      ops_->swiglu_forward(sp_gate_.data(), sp_up_.data(), static_cast<size_t>(n) * I, sp_h_.data());
      ops_->matmul(false, true, n, C, I, 1.f, sp_h_.data(), I, P + o.down, I, 0.f, part, C);
      ops_->add_inplace(x, part, static_cast<size_t>(n) * C);
    }
    full.ReleaseParams(unit);
    RETURN_IF_ERROR(st);
  }
  // Every row's residual on every rank (the logits rows may be anyone's).
  for (int t = 0; t < T; ++t) sp_recv_counts_[t] = sp_rows_[t] * C;
  const double t0 = Now();
  absl::Status st = group_->allgather(x, x_.data(), sp_recv_counts_, options_.timeout);
  stats_.sp_comm_seconds += Now() - t0;
  ++stats_.sp_collectives;
  stats_.sp_bytes += (static_cast<size_t>(rows) * C - static_cast<size_t>(n) * C) * sizeof(float);
  return st;
}

}  // namespace tandem::rollout
