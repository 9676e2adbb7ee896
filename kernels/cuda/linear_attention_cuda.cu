// Linear attention with decay on CUDA: host launchers of the kernels in
// linear_attention_kernel.cuh (the recurrent form, one thread per state
// column; results equal the chunked CPU form within fp32 rounding).
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/linear_attention_kernel.cuh"

namespace tandem::kernels {
namespace {

bool LinShapeOk(CudaOps& ops, const char* op, const LinearAttentionParams& p, int num_seqs) {
  if (p.num_heads <= 0 || p.key_dim <= 0 || p.value_dim <= 0) {
    ops.Fail(op, "bad heads / key_dim / value_dim");
    return false;
  }
  if (p.key_dim > 256) {
    ops.Fail(op, "key_dim " + std::to_string(p.key_dim) + " > 256 unsupported");
    return false;
  }
  if (num_seqs > 65535 || p.num_heads > 65535) {
    ops.Fail(op, "num_seqs or num_heads > 65535");
    return false;
  }
  return true;
}

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

void Zero(float* x, size_t n) {
  if (n == 0) return;
  cuda::LinAttnZeroKernel<<<cuda::GridFor(n, 256), 256>>>(x, n);
}

}  // namespace

void CudaOps::linear_attention_forward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                       const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                       const float* initial_state, float* out, float* final_state) {
  if (num_seqs <= 0 || t <= 0) return;
  if (!LinShapeOk(*this, "linear_attention_forward", p, num_seqs)) return;
  cuda::LinAttnArgs a = LinArgs(p, q, k, v, log_decay, cu, initial_state);
  a.out = out;
  a.final_state = final_state;
  const dim3 grid = LinGrid(p, num_seqs);
  cuda::DispatchLinAttn(p.key_dim,
                        [&]<int kMaxDk>() { cuda::LinAttnFwdKernel<kMaxDk><<<grid, cuda::kLinThreads>>>(a); });
  Check(cudaGetLastError(), "linear_attention_forward");
}

void CudaOps::linear_attention_backward(const LinearAttentionParams& p, const float* q, const float* k, const float* v,
                                        const float* log_decay, const int32_t* cu, int num_seqs, int t,
                                        const float* initial_state, const float* dout, const float* d_final_state,
                                        float* dq, float* dk, float* dv, float* d_log_decay, float* d_initial_state) {
  if (t <= 0) return;
  const size_t rows = static_cast<size_t>(t) * p.num_heads;
  Zero(dq, rows * p.key_dim);
  Zero(dk, rows * p.key_dim);
  Zero(dv, rows * p.value_dim);
  float* dg = log_decay != nullptr ? d_log_decay : nullptr;
  if (dg != nullptr) Zero(dg, rows);
  if (num_seqs <= 0) return;
  if (!LinShapeOk(*this, "linear_attention_backward", p, num_seqs)) return;
  cuda::LinAttnArgs a = LinArgs(p, q, k, v, log_decay, cu, initial_state);
  a.dout = dout;
  a.d_final = d_final_state;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.dg = dg;
  a.d_initial = d_initial_state;
  const dim3 grid = LinGrid(p, num_seqs);
  cuda::DispatchLinAttn(p.key_dim, [&]<int kMaxDk>() {
    cuda::LinAttnDqKernel<kMaxDk><<<grid, cuda::kLinThreads>>>(a);
    cuda::LinAttnDsKernel<kMaxDk><<<grid, cuda::kLinThreads>>>(a);
  });
  if (dg != nullptr) {
    const int tasks = num_seqs * p.num_heads;
    cuda::LinAttnDecayKernel<<<(tasks + 127) / 128, 128>>>(a, num_seqs);
  }
  Check(cudaGetLastError(), "linear_attention_backward");
}

}  // namespace tandem::kernels
