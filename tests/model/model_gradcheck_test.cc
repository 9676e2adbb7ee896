// Whole-model gradient check: analytic gradients from Model::Backward
// (reference ops, fp32) against central finite differences of an
// independent double-precision forward written here with plain loops.
// Tiny config with GQA, Qwen2 q/k/v biases, untied head, a sliding-window
// layer and linear RoPE scaling; a tied Llama variant; and Qwen3 (per-head
// q/k RMSNorm, head_dim != hidden/heads), tied and untied, the untied one
// with q/k/v biases (attention_bias) before the norms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/layer_types.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"

namespace tandem::model {
namespace {

using nlohmann::json;

// Independent double forward: sum_t w[t] * logp[t].
struct RefModel {
  const ModelConfig& c;
  const ParamLayout& l;

  double Loss(const std::vector<double>& p, const Batch& b, const std::vector<double>& w,
              std::vector<double>* logp_out) const {
    const int T = b.num_tokens(), C = c.hidden_size, H = c.num_attention_heads, KV = c.KvHeads(), D = c.HeadDim(),
              I = c.intermediate_size, V = c.vocab_size;
    auto at = [&](const std::string& name) { return p.data() + l.Find(name)->offset; };
    std::vector<double> x(T * C), xn(T * C);
    const double* E = at("model.embed_tokens.weight");
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < C; ++i) x[t * C + i] = E[b.tokens[t] * C + i];
    auto rmsnorm = [&](const std::vector<double>& in, const double* g, std::vector<double>& out) {
      for (int t = 0; t < T; ++t) {
        double ss = 0;
        for (int i = 0; i < C; ++i) ss += in[t * C + i] * in[t * C + i];
        const double r = 1.0 / std::sqrt(ss / C + c.rms_norm_eps);
        for (int i = 0; i < C; ++i) out[t * C + i] = in[t * C + i] * r * g[i];
      }
    };
    auto linear = [&](const std::vector<double>& in, int n_in, const double* W, int n_out, const double* bias,
                      std::vector<double>& out) {
      out.assign(static_cast<size_t>(T) * n_out, 0.0);
      for (int t = 0; t < T; ++t)
        for (int o = 0; o < n_out; ++o) {
          double s = bias ? bias[o] : 0.0;
          for (int i = 0; i < n_in; ++i) s += in[t * n_in + i] * W[o * n_in + i];
          out[t * n_out + o] = s;
        }
    };
    // RoPE (rotate_half), linear scaling.
    const double factor = c.has_rope_scaling ? c.rope_scaling.factor : 1.0;
    auto rope = [&](std::vector<double>& v, int nh) {
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < nh; ++h) {
          double* r = &v[(t * nh + h) * D];
          for (int i = 0; i < D / 2; ++i) {
            const double inv = 1.0 / std::pow(c.rope_theta, 2.0 * i / D) / factor;
            const double ang = b.positions[t] * inv;
            const double cs = std::cos(ang), sn = std::sin(ang);
            const double x1 = r[i], x2 = r[i + D / 2];
            r[i] = x1 * cs - x2 * sn;
            r[i + D / 2] = x2 * cs + x1 * sn;
          }
        }
    };
    // Per-head RMSNorm of q or k [T, nh, D] (Qwen3).
    auto head_norm = [&](std::vector<double>& v, int nh, const double* g) {
      for (int r = 0; r < T * nh; ++r) {
        double* row = &v[static_cast<size_t>(r) * D];
        double ss = 0;
        for (int i = 0; i < D; ++i) ss += row[i] * row[i];
        const double rs = 1.0 / std::sqrt(ss / D + c.rms_norm_eps);
        for (int i = 0; i < D; ++i) row[i] = row[i] * rs * g[i];
      }
    };
    std::vector<double> q, k, v, attn(T * H * D), tmp, g, u;
    for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
      const std::string pre = "model.layers." + std::to_string(layer) + ".";
      rmsnorm(x, at(pre + "input_layernorm.weight"), xn);
      const bool bias = c.HasQkvBias();
      linear(xn, C, at(pre + "self_attn.q_proj.weight"), H * D, bias ? at(pre + "self_attn.q_proj.bias") : nullptr, q);
      linear(xn, C, at(pre + "self_attn.k_proj.weight"), KV * D, bias ? at(pre + "self_attn.k_proj.bias") : nullptr, k);
      linear(xn, C, at(pre + "self_attn.v_proj.weight"), KV * D, bias ? at(pre + "self_attn.v_proj.bias") : nullptr, v);
      if (c.HasQkNorm()) {
        head_norm(q, H, at(pre + "self_attn.q_norm.weight"));
        head_norm(k, KV, at(pre + "self_attn.k_norm.weight"));
      }
      rope(q, H);
      rope(k, KV);
      const LayerType type = LayerTypeOf(c, layer);
      const int window = type.window;
      for (int s = 0; s < b.num_seqs() && type.kind == LayerKind::kLinear; ++s) {
        // Linear attention: S = gamma_h S + k^T v, out = q S / sqrt(D).
        for (int h = 0; h < H; ++h) {
          const double gamma = std::exp(LinearLogDecay(h));
          std::vector<double> st(D * D, 0.0);
          for (int i = b.cu_seqlens[s]; i < b.cu_seqlens[s + 1]; ++i) {
            for (int a = 0; a < D; ++a)
              for (int e = 0; e < D; ++e)
                st[a * D + e] = gamma * st[a * D + e] + k[(i * KV + h) * D + a] * v[(i * KV + h) * D + e];
            for (int e = 0; e < D; ++e) {
              double o = 0;
              for (int a = 0; a < D; ++a) o += q[(i * H + h) * D + a] * st[a * D + e];
              attn[(i * H + h) * D + e] = o / std::sqrt(static_cast<double>(D));
            }
          }
        }
      }
      for (int s = 0; s < b.num_seqs() && type.kind != LayerKind::kLinear; ++s) {
        for (int i = b.cu_seqlens[s]; i < b.cu_seqlens[s + 1]; ++i) {
          for (int h = 0; h < H; ++h) {
            const int kh = h / (H / KV);
            std::vector<double> sc;
            double mx = -1e300;
            for (int j = b.cu_seqlens[s]; j <= i; ++j) {
              const bool sink = type.kind == LayerKind::kSinkWindow && j - b.cu_seqlens[s] < type.sinks;
              if (window > 0 && i - j >= window && !sink) {
                sc.push_back(-1e300);
                continue;
              }
              double d = 0;
              for (int e = 0; e < D; ++e) d += q[(i * H + h) * D + e] * k[(j * KV + kh) * D + e];
              d /= std::sqrt(static_cast<double>(D));
              sc.push_back(d);
              mx = std::max(mx, d);
            }
            double z = 0;
            for (double& e : sc) {
              e = e <= -1e299 ? 0.0 : std::exp(e - mx);
              z += e;
            }
            for (int e = 0; e < D; ++e) {
              double o = 0;
              for (int j = b.cu_seqlens[s]; j <= i; ++j) o += sc[j - b.cu_seqlens[s]] / z * v[(j * KV + kh) * D + e];
              attn[(i * H + h) * D + e] = o;
            }
          }
        }
      }
      linear(attn, H * D, at(pre + "self_attn.o_proj.weight"), C, nullptr, tmp);
      for (int i = 0; i < T * C; ++i) x[i] += tmp[i];
      rmsnorm(x, at(pre + "post_attention_layernorm.weight"), xn);
      linear(xn, C, at(pre + "mlp.gate_proj.weight"), I, nullptr, g);
      linear(xn, C, at(pre + "mlp.up_proj.weight"), I, nullptr, u);
      for (int i = 0; i < T * I; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      linear(g, I, at(pre + "mlp.down_proj.weight"), C, nullptr, tmp);
      for (int i = 0; i < T * C; ++i) x[i] += tmp[i];
    }
    rmsnorm(x, at("model.norm.weight"), xn);
    const double* W = c.tie_word_embeddings ? E : at("lm_head.weight");
    std::vector<double> logits;
    linear(xn, C, W, V, nullptr, logits);
    double loss = 0;
    if (logp_out) logp_out->assign(T, 0.0);
    for (int t = 0; t < T; ++t) {
      double mx = -1e300;
      for (int i = 0; i < V; ++i) mx = std::max(mx, logits[t * V + i]);
      double z = 0;
      for (int i = 0; i < V; ++i) z += std::exp(logits[t * V + i] - mx);
      const double lp = logits[t * V + b.targets[t]] - mx - std::log(z);
      if (logp_out) (*logp_out)[t] = lp;
      loss += w[t] * lp;
    }
    return loss;
  }
};

enum class Variant { kQwen2, kLlama, kQwen3Untied, kQwen3Tied, kHybrid, kSinks };

ModelConfig MakeConfig(Variant variant) {
  const bool qwen = variant == Variant::kQwen2;
  json j = {
      {"vocab_size", 11},         {"hidden_size", 16},        {"intermediate_size", 24},       {"num_hidden_layers", 2},
      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0}};
  if (variant == Variant::kQwen3Untied || variant == Variant::kQwen3Tied) {
    // head_dim 6: the heads are 24 wide against hidden 16.
    j["model_type"] = "qwen3";
    j["head_dim"] = 6;
    j["tie_word_embeddings"] = variant == Variant::kQwen3Tied;
    j["attention_bias"] = variant == Variant::kQwen3Untied;
    if (variant == Variant::kQwen3Tied) j["num_key_value_heads"] = 1;
  } else if (qwen) {
    j["model_type"] = "qwen2";
    j["tie_word_embeddings"] = false;
    j["sliding_window"] = 3;
    j["layer_types"] = {"sliding_attention", "full_attention"};
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  } else if (variant == Variant::kHybrid) {
    // Tandem layer types: a linear-attention layer, then a window of 3.
    j["model_type"] = "llama";
    j["tie_word_embeddings"] = false;
    j["num_key_value_heads"] = 4;
    j["tandem_layer_types"] = {"linear", "window:3"};
  } else if (variant == Variant::kSinks) {
    // Tandem layer types: 2 attention sinks beside a window of 2 (the
    // 6- and 7-token sequences below mask the middle), then full.
    j["model_type"] = "llama";
    j["tie_word_embeddings"] = false;
    j["tandem_layer_types"] = {"sink:2+window:2", "full"};
  } else {
    j["model_type"] = "llama";
    j["tie_word_embeddings"] = true;
    j["num_key_value_heads"] = 1;
  }
  auto c = ParseConfigJson(j.dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Records the provider call sequence (checks the documented unit order).
class RecordingProvider : public ParamProvider {
 public:
  RecordingProvider(const ParamLayout& l, float* p, float* g) : l_(l), p_(p), g_(g) {}
  const float* AcquireParams(int u) override {
    log += "P" + std::to_string(u) + " ";
    return p_ + l_.unit_offset(u);
  }
  void ReleaseParams(int u) override { log += "p" + std::to_string(u) + " "; }
  float* AcquireGrads(int u) override {
    log += "G" + std::to_string(u) + " ";
    return g_ + l_.unit_offset(u);
  }
  void ReleaseGrads(int u) override { log += "g" + std::to_string(u) + " "; }
  std::string log;

 private:
  const ParamLayout& l_;
  float* p_;
  float* g_;
};

void RunGradCheck(Variant variant) {
  const bool tied = variant == Variant::kLlama || variant == Variant::kQwen3Tied;
  const ModelConfig c = MakeConfig(variant);
  auto ops = kernels::MakeReferenceOps();
  Model model(c, ops.get(), 4);  // grows on the first batch
  const ParamLayout& l = model.layout();
  std::vector<float> p(l.total_floats(), 0.f), grad(l.total_floats(), 0.f);
  std::mt19937_64 rng(11 + static_cast<int>(variant));
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& t : l.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      double v = nd(rng);
      switch (t.kind) {
        case TensorView::Kind::kMatrix:
          v *= 0.35;
          break;
        case TensorView::Kind::kNorm:
          v = 1.0 + 0.2 * v;
          break;
        case TensorView::Kind::kBias:
          v *= 0.2;
          break;
      }
      p[t.offset + i] = static_cast<float>(v);
    }
  }
  Batch b;
  std::vector<int32_t> s1 = {1, 4, 7, 2, 9, 3, 5}, s2 = {2, 8, 8, 1, 6, 10};
  b.AddSequence(s1);
  b.AddSequence(s2);
  const int T = b.num_tokens();
  std::vector<double> w(T);
  for (double& e : w) e = nd(rng);

  RecordingProvider pp(l, p.data(), grad.data());
  std::vector<float> logp(T);
  ASSERT_TRUE(model.ForwardLogprobs(b, pp, logp.data()).ok());
  std::vector<float> dlogp(w.begin(), w.end());
  ASSERT_TRUE(model.Backward(dlogp.data(), pp).ok());
  // Unit order: forward 0,1..L, L+1 (tied: head from unit 0); backward L+1..0.
  const std::string expect =
      !tied ? "P0 p0 P1 p1 P2 p2 P3 p3 P3 p3 P3 G3 g3 p3 P2 G2 g2 p2 P1 G1 g1 p1 G0 g0 "
            : "P0 p0 P1 p1 P2 p2 P3 p3 P0 p0 P3 G3 P0 G0 p0 g3 p3 P2 G2 g2 p2 P1 G1 g1 p1 G0 g0 g0 ";
  EXPECT_EQ(pp.log, expect);

  RefModel ref{c, l};
  std::vector<double> pd(p.begin(), p.end());
  std::vector<double> ref_logp;
  ref.Loss(pd, b, w, &ref_logp);
  double max_lp = 0;
  for (int t = 0; t < T; ++t) max_lp = std::max(max_lp, std::fabs(ref_logp[t] - logp[t]));
  EXPECT_LT(max_lp, 2e-5) << "forward logp differs from the double reference";

  // Central differences on every parameter.
  const double h = 1e-5;
  double max_abs = 0, max_grad = 0, max_rel_big = 0;
  std::string worst;
  for (const auto& t : l.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      const size_t k = t.offset + i;
      const double save = pd[k];
      pd[k] = save + h;
      const double lp = ref.Loss(pd, b, w, nullptr);
      pd[k] = save - h;
      const double lm = ref.Loss(pd, b, w, nullptr);
      pd[k] = save;
      const double num = (lp - lm) / (2 * h);
      const double err = std::fabs(num - grad[k]);
      max_grad = std::max(max_grad, std::fabs(num));
      if (err > max_abs) {
        max_abs = err;
        worst = t.name + "[" + std::to_string(i) + "]";
      }
      if (std::fabs(num) > 1e-2) max_rel_big = std::max(max_rel_big, err / std::fabs(num));
    }
  }
  const char* names[] = {"qwen2/untied/sliding",       "llama/tied",       "qwen3/untied/bias", "qwen3/tied/mqa",
                         "llama/hybrid linear+window", "llama/sink+window"};
  std::printf(
      "[gradcheck %s] max |analytic - numeric| = %.3g (at %s), max |grad| = %.3g, "
      "relative to max = %.3g, max relative (|g| > 1e-2) = %.3g, forward max |dlogp| = %.3g\n",
      names[static_cast<int>(variant)], max_abs, worst.c_str(), max_grad, max_abs / max_grad, max_rel_big, max_lp);
  EXPECT_LT(max_abs / max_grad, 1e-4);
  EXPECT_LT(max_rel_big, 1e-3);
  // The fast CPU backend's gradients agree with the reference backend's.
  {
    auto cpu = kernels::MakeCpuOps(2);
    Model cpu_model(c, cpu.get());
    std::vector<float> cpu_grad(l.total_floats(), 0.f);
    FlatParamProvider cpp(cpu_model.layout(), p.data(), cpu_grad.data());
    std::vector<float> cpu_logp(T);
    ASSERT_TRUE(cpu_model.ForwardLogprobs(b, cpp, cpu_logp.data()).ok());
    ASSERT_TRUE(cpu_model.Backward(dlogp.data(), cpp).ok());
    double diff = 0;
    for (size_t i = 0; i < grad.size(); ++i) diff = std::max(diff, std::fabs(double(cpu_grad[i]) - grad[i]));
    EXPECT_LT(diff / max_grad, 1e-5) << "cpu backend gradients";
  }
  if (c.HasQkNorm()) {
    // The q/k norm weights get gradients, and they are checked above.
    double norm_grad = 0;
    for (const char* n : {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"}) {
      const TensorView* t = l.Find(n);
      ASSERT_NE(t, nullptr) << n;
      for (size_t i = 0; i < t->numel; ++i) norm_grad += std::fabs(grad[t->offset + i]);
    }
    EXPECT_GT(norm_grad, 1e-3);
  }
}

TEST(GradCheckTest, Qwen2UntiedSlidingWindowGqa) { RunGradCheck(Variant::kQwen2); }
TEST(GradCheckTest, LlamaTiedMqa) { RunGradCheck(Variant::kLlama); }
TEST(GradCheckTest, Qwen3UntiedBiasQkNormHeadDim) { RunGradCheck(Variant::kQwen3Untied); }
TEST(GradCheckTest, Qwen3TiedQkNormMqa) { RunGradCheck(Variant::kQwen3Tied); }
TEST(GradCheckTest, HybridLinearAndWindowLayers) { RunGradCheck(Variant::kHybrid); }
TEST(GradCheckTest, AttentionSinkLayers) { RunGradCheck(Variant::kSinks); }

TEST(ModelTest, RejectsBadBatches) {
  const ModelConfig c = MakeConfig(Variant::kLlama);
  auto ops = kernels::MakeReferenceOps();
  Model model(c, ops.get());
  std::vector<float> p(model.layout().total_floats());
  model.InitParams(1, p.data());
  FlatParamProvider pp(model.layout(), p.data(), nullptr);
  std::vector<float> logp(8);
  Batch b;
  EXPECT_FALSE(model.ForwardLogprobs(b, pp, logp.data()).ok());
  std::vector<int32_t> seq = {1, 2, 3};
  b.AddSequence(seq);
  Batch bad = b;
  bad.tokens[0] = 11;
  EXPECT_FALSE(model.ForwardLogprobs(bad, pp, logp.data()).ok());
  bad = b;
  bad.cu_seqlens.back() = 5;
  EXPECT_FALSE(model.ForwardLogprobs(bad, pp, logp.data()).ok());
  bad = b;
  bad.targets.pop_back();
  EXPECT_FALSE(model.ForwardLogprobs(bad, pp, logp.data()).ok());
  EXPECT_FALSE(model.Backward(logp.data(), pp).ok());  // no forward yet
  EXPECT_TRUE(model.ForwardLogprobs(b, pp, logp.data()).ok());
}

TEST(ModelTest, InitIsDeterministicAndHfLike) {
  const ModelConfig c = MakeConfig(Variant::kQwen2);
  Model model(c, nullptr);
  std::vector<float> a(model.layout().total_floats()), b(a.size());
  model.InitParams(42, a.data());
  model.InitParams(42, b.data());
  EXPECT_EQ(a, b);
  model.InitParams(43, b.data());
  EXPECT_NE(a, b);
  double s = 0, ss = 0;
  size_t n = 0;
  for (const auto& t : model.layout().tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      const float v = a[t.offset + i];
      if (t.kind == TensorView::Kind::kNorm) EXPECT_EQ(v, 1.f);
      if (t.kind == TensorView::Kind::kBias) EXPECT_EQ(v, 0.f);
      if (t.kind == TensorView::Kind::kMatrix) {
        s += v;
        ss += v * v;
        ++n;
      }
    }
  }
  EXPECT_NEAR(s / n, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(ss / n), 0.02, 0.002);
}

TEST(ModelTest, SftLoss) {
  std::vector<float> logp = {-1.f, -2.f, -3.f, -4.f}, mask = {0.f, 1.f, 1.f, 0.f}, d(4);
  EXPECT_FLOAT_EQ(SftLoss(logp, mask, d.data()), 2.5f);
  EXPECT_EQ(d, (std::vector<float>{0.f, -0.5f, -0.5f, 0.f}));
}

}  // namespace
}  // namespace tandem::model
