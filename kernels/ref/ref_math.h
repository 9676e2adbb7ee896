// Reference math for every non-attention op, as header templates so tests can
// instantiate them in double (finite-difference gradient checks) while the
// reference backend uses T = float. Plain loops, double accumulators, no
// cleverness: this is the yardstick the fast backends are tested against.
//
// Conventions are those of kernels/ops.h: row-major, backward functions
// ACCUMULATE parameter gradients (dw, dtable, dbias) and OVERWRITE activation
// gradients. Functions may allocate (reference only, never a hot path).
// lm_head: a target outside [0, V) means "no target": logp = 0 and the row
// contributes no gradient (entropy is still computed).
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::kernels::ref {

// C[M,N] = alpha * op(A) op(B) + beta * C. With beta == 0, C is not read
// (BLAS semantics: NaNs in C do not propagate).
template <typename T>
void matmul(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb, T beta,
            T* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double av = trans_a ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
        const double bv = trans_b ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
        acc += av * bv;
      }
      T& out = c[static_cast<size_t>(i) * ldc + j];
      const double prev = beta == T(0) ? 0.0 : static_cast<double>(beta) * out;
      out = static_cast<T>(static_cast<double>(alpha) * acc + prev);
    }
  }
}

template <typename T>
void embedding_forward(const int32_t* ids, int t, const T* table, int c, T* out) {
  for (int i = 0; i < t; ++i)
    for (int j = 0; j < c; ++j) out[static_cast<size_t>(i) * c + j] = table[static_cast<size_t>(ids[i]) * c + j];
}

template <typename T>
void embedding_backward(const int32_t* ids, int t, const T* dout, int c, T* dtable) {
  for (int i = 0; i < t; ++i)
    for (int j = 0; j < c; ++j) dtable[static_cast<size_t>(ids[i]) * c + j] += dout[static_cast<size_t>(i) * c + j];
}

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
template <typename T>
void rmsnorm_forward(const T* x, const T* w, int t, int c, T eps, T* y, T* rstd) {
  for (int i = 0; i < t; ++i) {
    const T* xr = x + static_cast<size_t>(i) * c;
    double ss = 0;
    for (int j = 0; j < c; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const double r = 1.0 / std::sqrt(ss / c + static_cast<double>(eps));
    rstd[i] = static_cast<T>(r);
    for (int j = 0; j < c; ++j)
      y[static_cast<size_t>(i) * c + j] = static_cast<T>(static_cast<double>(xr[j]) * r * w[j]);
  }
}

// dx_j = r * (dy_j w_j - x_j r^2 (sum_i dy_i w_i x_i) / C); dw_j += dy_j x_j r.
template <typename T>
void rmsnorm_backward(const T* dy, const T* x, const T* w, const T* rstd, int t, int c, T* dx, T* dw) {
  std::vector<double> dw_acc(c, 0.0);
  for (int i = 0; i < t; ++i) {
    const size_t off = static_cast<size_t>(i) * c;
    const double r = rstd[i];
    double dot = 0;
    for (int j = 0; j < c; ++j) dot += static_cast<double>(dy[off + j]) * w[j] * x[off + j];
    const double coef = r * r * dot / c;
    for (int j = 0; j < c; ++j) {
      dx[off + j] = static_cast<T>(r * (static_cast<double>(dy[off + j]) * w[j] - x[off + j] * coef));
      dw_acc[j] += static_cast<double>(dy[off + j]) * x[off + j] * r;
    }
  }
  for (int j = 0; j < c; ++j) dw[j] = static_cast<T>(static_cast<double>(dw[j]) + dw_acc[j]);
}

template <typename T>
double sigmoid(T x) {
  return 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
}

// h = silu(g) * u = g * sigmoid(g) * u.
template <typename T>
void swiglu_forward(const T* gate, const T* up, size_t n, T* h) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    h[i] = static_cast<T>(g * sigmoid(gate[i]) * up[i]);
  }
}

// dg = dh * u * s * (1 + g (1 - s)), du = dh * g * s, s = sigmoid(g).
template <typename T>
void swiglu_backward(const T* dh, const T* gate, const T* up, size_t n, T* dgate, T* dup) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double s = sigmoid(gate[i]);
    const double d = dh[i];
    dgate[i] = static_cast<T>(d * up[i] * s * (1.0 + g * (1.0 - s)));
    dup[i] = static_cast<T>(d * g * s);
  }
}

template <typename T>
void add_inplace(T* y, const T* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T>
void add_bias(T* y, const T* bias, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) y[static_cast<size_t>(r) * cols + j] += bias[j];
}

template <typename T>
void bias_backward(const T* dy, int rows, int cols, T* dbias) {
  for (int j = 0; j < cols; ++j) {
    double acc = 0;
    for (int r = 0; r < rows; ++r) acc += dy[static_cast<size_t>(r) * cols + j];
    dbias[j] = static_cast<T>(static_cast<double>(dbias[j]) + acc);
  }
}

// HF apply_rotary_pos_emb (rotate_half layout), in place on x [T, nh, D]:
//   forward: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)
//   inverse (transpose): (x1, x2) -> (x1 c + x2 s, x2 c - x1 s)
// where x1 = x[:D/2], x2 = x[D/2:], c/s from the tables at positions[t].
template <typename T>
void rope_apply(T* x, const int32_t* positions, int t, int nh, int d, const T* cos, const T* sin, bool inverse) {
  const int half = d / 2;
  for (int i = 0; i < t; ++i) {
    const T* cr = cos + static_cast<size_t>(positions[i]) * half;
    const T* sr = sin + static_cast<size_t>(positions[i]) * half;
    for (int h = 0; h < nh; ++h) {
      T* xr = x + (static_cast<size_t>(i) * nh + h) * d;
      for (int j = 0; j < half; ++j) {
        const double x1 = xr[j], x2 = xr[j + half];
        const double c = cr[j];
        const double s = inverse ? -static_cast<double>(sr[j]) : sr[j];
        xr[j] = static_cast<T>(x1 * c - x2 * s);
        xr[j + half] = static_cast<T>(x2 * c + x1 * s);
      }
    }
  }
}

// logits[t] = h[t] . w^T; logp[t] = log_softmax(logits[t])[targets[t]];
// entropy[t] = -sum p log p (when entropy != nullptr). Row by row in double.
template <typename T>
void lm_head_logprobs_forward(const T* h, const T* w, const int32_t* targets, int t, int c, int v, T* logp,
                              T* entropy) {
  std::vector<double> logits(v);
  for (int i = 0; i < t; ++i) {
    const T* hr = h + static_cast<size_t>(i) * c;
    double mx = -INFINITY;
    for (int j = 0; j < v; ++j) {
      const T* wr = w + static_cast<size_t>(j) * c;
      double acc = 0;
      for (int k = 0; k < c; ++k) acc += static_cast<double>(hr[k]) * wr[k];
      logits[j] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0, sum_el = 0;
    for (int j = 0; j < v; ++j) {
      const double e = std::exp(logits[j] - mx);
      sum += e;
      sum_el += e * logits[j];
    }
    const double lse = mx + std::log(sum);
    const int tg = targets[i];
    logp[i] = (tg >= 0 && tg < v) ? static_cast<T>(logits[tg] - lse) : T(0);
    if (entropy) entropy[i] = static_cast<T>(lse - sum_el / sum);
  }
}

// dlogits[t, j] = dlogp[t] * (onehot(targets[t])_j - softmax(logits[t])_j);
// dh[t] = dlogits[t] . w (overwritten); dw += dlogits^T h (accumulated).
template <typename T>
void lm_head_logprobs_backward(const T* h, const T* w, const int32_t* targets, const T* dlogp, int t, int c, int v,
                               T* dh, T* dw) {
  std::vector<double> logits(v);
  std::vector<double> dw_acc(static_cast<size_t>(v) * c, 0.0);
  std::vector<double> dh_row(c);
  for (int i = 0; i < t; ++i) {
    const T* hr = h + static_cast<size_t>(i) * c;
    const int tg = targets[i];
    const double g = (tg >= 0 && tg < v) ? static_cast<double>(dlogp[i]) : 0.0;
    double mx = -INFINITY;
    for (int j = 0; j < v; ++j) {
      const T* wr = w + static_cast<size_t>(j) * c;
      double acc = 0;
      for (int k = 0; k < c; ++k) acc += static_cast<double>(hr[k]) * wr[k];
      logits[j] = acc;
      mx = std::max(mx, acc);
    }
    double sum = 0;
    for (int j = 0; j < v; ++j) sum += std::exp(logits[j] - mx);
    const double lse = mx + std::log(sum);
    std::fill(dh_row.begin(), dh_row.end(), 0.0);
    for (int j = 0; j < v; ++j) {
      const double p = std::exp(logits[j] - lse);
      const double dl = g * ((j == tg ? 1.0 : 0.0) - p);
      const T* wr = w + static_cast<size_t>(j) * c;
      double* dwr = dw_acc.data() + static_cast<size_t>(j) * c;
      for (int k = 0; k < c; ++k) {
        dh_row[k] += dl * wr[k];
        dwr[k] += dl * hr[k];
      }
    }
    for (int k = 0; k < c; ++k) dh[static_cast<size_t>(i) * c + k] = static_cast<T>(dh_row[k]);
  }
  for (size_t e = 0; e < dw_acc.size(); ++e) dw[e] = static_cast<T>(static_cast<double>(dw[e]) + dw_acc[e]);
}

template <typename T>
double sum_squares(const T* g, size_t n) {
  double acc = 0;
  for (size_t i = 0; i < n; ++i) acc += static_cast<double>(g[i]) * g[i];
  return acc;
}

template <typename T>
void scale(T* x, T s, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

// torch.optim.AdamW: p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p) with
// mhat = m / (1 - beta1^step), vhat = v / (1 - beta2^step); m, v updated first.
template <typename T>
void adamw_step(T* p, const T* g, T* m, T* v, size_t n, T lr, T beta1, T beta2, T eps, T weight_decay, int64_t step) {
  const double b1 = beta1, b2 = beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  for (size_t i = 0; i < n; ++i) {
    const double gi = g[i];
    const double mi = b1 * m[i] + (1.0 - b1) * gi;
    const double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    const double mhat = mi / bc1;
    const double vhat = vi / bc2;
    const double pi = p[i];
    p[i] = static_cast<T>(pi - static_cast<double>(lr) * (mhat / (std::sqrt(vhat) + static_cast<double>(eps)) +
                                                          static_cast<double>(weight_decay) * pi));
  }
}

}  // namespace tandem::kernels::ref
