#include "kernels/cuda/emu/cuda_emu.h"
// The emulator must come first: it defines the CUDA keywords.
#include "kernels/cuda/emu/emu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/backends.h"
#include "kernels/cuda/attention_bwd_kernel.cuh"
#include "kernels/cuda/attention_fwd_kernel.cuh"
#include "kernels/cuda/decode_attention_kernel.cuh"
#include "kernels/cuda/linear_attention_kernel.cuh"
#include "kernels/cuda/lm_head_kernel.cuh"
#include "kernels/cuda/optimizer_kernel.cuh"
#include "kernels/cuda/paged_attention_kernel.cuh"
#include "kernels/cuda/paged_sparse_kernel.cuh"
#include "kernels/cuda/quantize_int8_kernel.cuh"
#include "kernels/cuda/rmsnorm_kernel.cuh"
#include "kernels/cuda/sample_filter_kernel.cuh"
#include "kernels/cuda/sample_kernel.cuh"

namespace tandem::kernels {
namespace {

cuda::LinAttnArgs LinArgs(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                          const float* g, const int32_t* cu, const float* initial) {
  cuda::LinAttnArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.g = g;
  a.cu = cu;
  a.initial = initial;
  a.num_heads = p.num_heads;
  a.dk_dim = p.key_dim;
  a.dv_dim = p.value_dim;
  a.scale = p.scale != 0.f ? p.scale : 1.f / sqrtf(static_cast<float>(p.key_dim));
  return a;
}

dim3 LinGrid(const LinearAttentionParams& p, int num_seqs) {
  return dim3((p.value_dim + cuda::kLinThreads - 1) / cuda::kLinThreads, p.num_heads, num_seqs);
}

class EmuOps final : public Ops {
 public:
  const char* name() const override { return "cuda-emu"; }

  void attention_forward(const AttentionParams& p, const float* q, const float* k, const float* v, const int32_t* cu,
                         int nseq, int t, float* out, float* lse) override {
    if (t <= 0 || nseq <= 0) return;
    const cuda::AttnFwdArgs a = cuda::FwdArgsOf(p, q, k, v, out, lse, cu, nseq);
    cuda::DispatchAttnTiles(p.head_dim, [&]<int kMaxD, int kBr, int kBc>() {
      tandem_emu::Launch(dim3(cuda::TileGridX(t, nseq, kBr), p.num_heads), dim3(cuda::kAttnThreads),
                         cuda::FwdSmemBytes<kMaxD, kBr, kBc>(), [&] { cuda::AttnFwdKernel<kMaxD, kBr, kBc>(a); });
    });
  }

  // dq is zeroed (atomics accumulate into it); dk and dv are left as they
  // are, so a key row the kernel never writes shows up.
  void attention_backward(const AttentionParams& p, const float* q, const float* k, const float* v, const float* out,
                          const float* dout, const float* lse, const int32_t* cu, int nseq, int t, float* dq, float* dk,
                          float* dv) override {
    if (t <= 0 || nseq <= 0) return;
    const size_t rows = size_t(t) * p.num_heads;
    std::vector<float> delta(rows);
    std::fill(dq, dq + rows * p.head_dim, 0.f);
    tandem_emu::Launch(dim3(cuda::GridFor(rows * cuda::kWarp, 256, 65535u * 4u)), dim3(256), 0,
                       [&] { cuda::AttnDeltaKernel(out, dout, rows, p.head_dim, delta.data()); });
    const cuda::AttnBwdArgs a = cuda::BwdArgsOf(p, q, k, v, dout, lse, delta.data(), dq, dk, dv, cu, nseq);
    cuda::DispatchAttnTiles(p.head_dim, [&]<int kMaxD, int kBr, int kBc>() {
      tandem_emu::Launch(dim3(cuda::TileGridX(t, nseq, kBc), p.num_kv_heads), dim3(cuda::kAttnThreads),
                         cuda::BwdSmemBytes<kMaxD, kBr, kBc>(), [&] { cuda::AttnBwdKernel<kMaxD, kBr, kBc>(a); });
    });
  }

  void decode_attention(const AttentionParams& p, const float* q, int batch, int n_new, const float* k_cache,
                        const float* v_cache, int cap, const int32_t* cache_len, float* out) override {
    if (batch <= 0 || n_new <= 0) return;
    const cuda::DecodeArgs a{q,        k_cache, v_cache,           cache_len,      out,
                             n_new,    cap,     p.num_heads,       p.num_kv_heads, p.head_dim,
                             p.window, p.sinks, cuda::AttnScale(p)};
    cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() {
      tandem_emu::Launch(dim3(p.num_heads, n_new, batch), dim3(cuda::kDecodeWarps * cuda::kWarp), 0,
                         [&] { cuda::DecodeKernel<kMaxD>(a); });
    });
  }

  void paged_kv_write(const PagedKv& kv, int kd, const float* k, const float* v, const int32_t* slots, int t) override {
    if (t <= 0 || kd <= 0) return;
    const int threads = kd >= 256 ? 256 : ((kd + 31) / 32) * 32;
    tandem_emu::Launch(dim3(t), dim3(threads), 0, [&] {
      if (kv.dtype == KvDtype::kBF16) {
        cuda::PagedKvWriteKernel<uint16_t>(kv.k, kv.v, kd, k, v, slots);
      } else {
        cuda::PagedKvWriteKernel<float>(kv.k, kv.v, kd, k, v, slots);
      }
    });
  }

  void paged_attention(const AttentionParams& p, const PagedKv& kv, const float* q, const int32_t* row_seq,
                       const int32_t* row_pos, int t, float* out) override {
    if (t <= 0) return;
    const cuda::PagedArgs a{q,
                            kv.k,
                            kv.v,
                            kv.block_tables,
                            row_seq,
                            row_pos,
                            out,
                            kv.block_size,
                            kv.max_blocks,
                            p.num_heads,
                            p.num_kv_heads,
                            p.head_dim,
                            p.window,
                            p.sinks,
                            cuda::AttnScale(p)};
    cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() {
      tandem_emu::Launch(dim3(p.num_heads, t), dim3(cuda::kPagedWarps * cuda::kWarp), 0, [&] {
        if (kv.dtype == KvDtype::kBF16) {
          cuda::PagedAttentionKernel<kMaxD, uint16_t>(a);
        } else {
          cuda::PagedAttentionKernel<kMaxD, float>(a);
        }
      });
    });
  }

  // As CudaOps (linear_attention_cuda.cu): the recurrent kernels, one thread
  // per state column.
  void linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                const float* initial_state, float* out, float* final_state) override {
    if (num_seqs <= 0 || t <= 0) return;
    cuda::LinAttnArgs a = LinArgs(p, q, k, v, log_decay, cu, initial_state);
    a.out = out;
    a.final_state = final_state;
    cuda::DispatchLinAttn(p.key_dim, [&]<int kMaxDk>() {
      tandem_emu::Launch(LinGrid(p, num_seqs), dim3(cuda::kLinThreads), 0, [&] { cuda::LinAttnFwdKernel<kMaxDk>(a); });
    });
  }

  void linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                 const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                 const float* initial_state, const float* dout, const float* d_final_state, float* dq,
                                 float* dk, float* dv, float* d_log_decay, float* d_initial_state) override {
    if (t <= 0) return;
    const size_t rows = size_t(t) * p.num_heads;
    std::fill(dq, dq + rows * p.key_dim, 0.f);
    std::fill(dk, dk + rows * p.key_dim, 0.f);
    std::fill(dv, dv + rows * p.value_dim, 0.f);
    float* dg = log_decay != nullptr ? d_log_decay : nullptr;
    if (dg != nullptr) std::fill(dg, dg + rows, 0.f);
    if (num_seqs <= 0) return;
    cuda::LinAttnArgs a = LinArgs(p, q, k, v, log_decay, cu, initial_state);
    a.dout = dout;
    a.d_final = d_final_state;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.dg = dg;
    a.d_initial = d_initial_state;
    cuda::DispatchLinAttn(p.key_dim, [&]<int kMaxDk>() {
      tandem_emu::Launch(LinGrid(p, num_seqs), dim3(cuda::kLinThreads), 0, [&] { cuda::LinAttnDqKernel<kMaxDk>(a); });
      tandem_emu::Launch(LinGrid(p, num_seqs), dim3(cuda::kLinThreads), 0, [&] { cuda::LinAttnDsKernel<kMaxDk>(a); });
    });
    if (dg != nullptr) {
      const int tasks = num_seqs * p.num_heads;
      tandem_emu::Launch(dim3((tasks + 127) / 128), dim3(128), 0, [&] { cuda::LinAttnDecayKernel(a, num_seqs); });
    }
  }

  void rmsnorm_forward(const float* x, const float* w, int t, int c, float eps, float* y, float* rstd) override {
    if (t <= 0 || c <= 0) return;
    tandem_emu::Launch(dim3(t), dim3(cuda::RowThreads(c)), 0,
                       [&] { cuda::RmsnormForwardKernel(x, w, c, eps, y, rstd); });
  }

  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int t, int c, float* dx,
                        float* dw) override {
    if (t <= 0 || c <= 0) return;
    tandem_emu::Launch(dim3(t), dim3(cuda::RowThreads(c)), 0,
                       [&] { cuda::RmsnormBackwardDxKernel(dy, x, w, rstd, c, dx); });
    tandem_emu::Launch(dim3((c + cuda::kDwThreads - 1) / cuda::kDwThreads, (t + cuda::kDwRows - 1) / cuda::kDwRows),
                       dim3(cuda::kDwThreads), 0, [&] { cuda::RmsnormBackwardDwKernel(dy, x, rstd, t, c, dw); });
  }

  // As CudaOps: per chunk of tokens a GEMM into scratch, then the row kernels.
  void lm_head_logprobs_forward(const float* h, const float* w, const int32_t* targets, int t, int c, int v, int chunk,
                                float* scratch, float* logp, float* entropy) override {
    for (int t0 = 0; t0 < t; t0 += chunk) {
      const int n = std::min(chunk, t - t0);
      gemm_->matmul(false, true, n, v, c, 1.f, h + size_t(t0) * c, c, w, c, 0.f, scratch, v);
      tandem_emu::Launch(dim3(n), dim3(cuda::kLmThreads), 0, [&] {
        cuda::LogprobRowKernel(scratch, v, targets + t0, logp + t0, entropy != nullptr ? entropy + t0 : nullptr);
      });
    }
  }

  void lm_head_logprobs_backward(const float* h, const float* w, const int32_t* targets, const float* dlogp, int t,
                                 int c, int v, int chunk, float* scratch, float* dh, float* dw) override {
    for (int t0 = 0; t0 < t; t0 += chunk) {
      const int n = std::min(chunk, t - t0);
      const float* hc = h + size_t(t0) * c;
      gemm_->matmul(false, true, n, v, c, 1.f, hc, c, w, c, 0.f, scratch, v);
      tandem_emu::Launch(dim3(n), dim3(cuda::kLmThreads), 0,
                         [&] { cuda::DlogitsRowKernel(scratch, v, targets + t0, dlogp + t0); });
      gemm_->matmul(false, false, n, c, v, 1.f, scratch, v, w, c, 0.f, dh + size_t(t0) * c, c);
      gemm_->matmul(true, false, v, c, n, 1.f, scratch, v, hc, c, 1.f, dw, c);
    }
  }

  double sum_squares(const float* g, size_t n) override {
    if (n == 0) return 0.0;
    double slot = 0.0;
    tandem_emu::Launch(dim3(cuda::GridFor(n, cuda::kOptThreads, 1024)), dim3(cuda::kOptThreads), 0,
                       [&] { cuda::SumSquaresKernel(g, n, &slot); });
    return slot;
  }

  void adamw_step(float* p, const float* g, float* m, float* v, size_t n, float lr, float beta1, float beta2, float eps,
                  float wd, int64_t step) override {
    if (n == 0) return;
    const double bc1 = 1.0 - std::pow(double(beta1), double(step));
    const double bc2 = 1.0 - std::pow(double(beta2), double(step));
    tandem_emu::Launch(dim3(cuda::GridFor(n, cuda::kOptThreads)), dim3(cuda::kOptThreads), 0, [&] {
      cuda::AdamwKernel(p, g, m, v, n, lr, beta1, beta2, eps, wd, float(1.0 / bc1), float(1.0 / bc2));
    });
  }

  void sample_logits(const float* logits, int rows, int v, float temperature, const double* uniforms, int32_t* ids,
                     float* logp_sample, float* logp_raw) override {
    if (rows <= 0 || v <= 0) return;
    tandem_emu::Launch(dim3(rows), dim3(cuda::kSampleThreads), 0,
                       [&] { cuda::SampleRowKernel(logits, v, temperature, uniforms, ids, logp_sample, logp_raw); });
  }

  void sample_filtered(const float* logits, int rows, int v, const SampleFilter& f, const int32_t* seen_offsets,
                       const int32_t* seen, const double* uniforms, int32_t* ids, float* logp_sample,
                       float* logp_raw) override {
    if (rows <= 0 || v <= 0) return;
    const cuda::FilterArgs a =
        cuda::MakeFilterArgs(logits, v, f, seen_offsets, seen, uniforms, ids, logp_sample, logp_raw);
    const size_t smem = cuda::FilterSharedBytes(a);
    tandem_emu::Launch(dim3(rows), dim3(cuda::kFilterThreads), smem, [&] { cuda::SampleFilterKernel(a); });
  }

  // Ops without block-cooperative kernels: not emulated.
  void matmul(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int) override {
    Unsupported("matmul");
  }
  void embedding_forward(const int32_t*, int, const float*, int, float*) override { Unsupported("embedding_forward"); }
  void embedding_backward(const int32_t*, int, const float*, int, float*) override {
    Unsupported("embedding_backward");
  }
  void swiglu_forward(const float*, const float*, size_t, float*) override { Unsupported("swiglu_forward"); }
  void swiglu_backward(const float*, const float*, const float*, size_t, float*, float*) override {
    Unsupported("swiglu_backward");
  }
  void add_inplace(float*, const float*, size_t) override { Unsupported("add_inplace"); }
  void add_bias(float*, const float*, int, int) override { Unsupported("add_bias"); }
  void bias_backward(const float*, int, int, float*) override { Unsupported("bias_backward"); }
  void rope_apply(float*, const int32_t*, int, int, int, const float*, const float*, bool) override {
    Unsupported("rope_apply");
  }
  void scale(float*, float, size_t) override { Unsupported("scale"); }
  void key_block_summaries(const AttentionParams&, int, const float*, int, const int32_t*, int, int, float*) override {
    Unsupported("key_block_summaries");
  }
  void sparse_decode_attention(const AttentionParams&, const SparseDecodeParams&, const float*, int, const float*,
                               const float*, int, const int32_t*, const float*, float*) override {
    Unsupported("sparse_decode_attention");
  }
  // As CudaOps (sparse_decode_cuda.cu).
  void paged_key_summaries(const AttentionParams& p, const PagedKv& kv, const int32_t* slots, int t,
                           float* summaries) override {
    if (t <= 0) return;
    const int threads = p.head_dim >= 128 ? 128 : ((p.head_dim + 31) / 32) * 32;
    tandem_emu::Launch(dim3(p.num_kv_heads), dim3(threads), 0, [&] {
      if (kv.dtype == KvDtype::kBF16) {
        cuda::PagedKeySummariesKernel<uint16_t>(kv.k, slots, t, kv.block_size, p.num_kv_heads, p.head_dim, summaries);
      } else {
        cuda::PagedKeySummariesKernel<float>(kv.k, slots, t, kv.block_size, p.num_kv_heads, p.head_dim, summaries);
      }
    });
  }
  void paged_sparse_attention(const AttentionParams& p, const SparseDecodeParams& s, const PagedKv& kv,
                              const float* summaries, const float* q, const int32_t* row_seq, const int32_t* row_pos,
                              int t, float* out) override {
    if (t <= 0) return;
    const cuda::PagedSparseArgs a = cuda::MakePagedSparseArgs(p, s, kv, summaries, q, row_seq, row_pos, out);
    cuda::DispatchDecode(p.head_dim, [&]<int kMaxD>() {
      tandem_emu::Launch(dim3(p.num_heads, t), dim3(cuda::kSparseThreads), cuda::PagedSparseSmemBytes(a.max_blocks),
                         [&] {
                           if (kv.dtype == KvDtype::kBF16) {
                             cuda::PagedSparseKernel<kMaxD, uint16_t>(a);
                           } else {
                             cuda::PagedSparseKernel<kMaxD, float>(a);
                           }
                         });
    });
  }
  void quantize_int8(const float* x, size_t n, float* wire, uint64_t seed) override {
    if (n == 0) return;
    tandem_emu::Launch(dim3(static_cast<unsigned>(std::min<size_t>(Int8Blocks(n), 64))), dim3(cuda::kQuantThreads), 0,
                       [&] { cuda::QuantizeInt8Kernel(x, n, wire, seed); });
  }
  void dequantize_int8(const float* wire, size_t n, float* out) override {
    if (n == 0) return;
    tandem_emu::Launch(dim3(cuda::GridFor(n, 256, 16)), dim3(256), 0,
                       [&] { cuda::DequantizeInt8Kernel(wire, n, out); });
  }

  void float_to_bf16(const float*, uint16_t*, size_t) override { Unsupported("float_to_bf16"); }
  void bf16_to_float(const uint16_t*, float*, size_t) override { Unsupported("bf16_to_float"); }

 private:
  [[noreturn]] static void Unsupported(const char* op) {
    std::fprintf(stderr, "cuda-emu: %s has no emulated kernel\n", op);
    std::abort();
  }

  std::unique_ptr<Ops> gemm_ = MakeReferenceOps();
};

}  // namespace

std::unique_ptr<Ops> MakeEmuOps() { return std::make_unique<EmuOps>(); }

bool EmuSupports(const std::string& op) {
  return op == "attention" || op == "decode_attention" || op == "paged_attention" || op == "rmsnorm" ||
         op == "lm_head" || op == "sum_squares" || op == "adamw" || op == "sample_logits" || op == "sample_filtered" ||
         op == "linear_attention" || op == "int8_blocks" || op == "paged_sparse";
}

}  // namespace tandem::kernels
