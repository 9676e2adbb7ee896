#include "worker/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::model {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Picks a token from one row of logits; returns (token, sampling logprob,
// raw logprob). `idx` and `prob` are scratch of V entries.
struct Pick {
  int32_t token;
  float logprob;
  float raw_logprob;
};

Pick SampleRow(const float* logits, int v, const SamplingOptions& o, double u,
               std::vector<int32_t>& idx, std::vector<double>& prob) {
  double mx = -INFINITY;
  int32_t arg = 0;
  for (int i = 0; i < v; ++i) {
    if (logits[i] > mx) { mx = logits[i]; arg = i; }
  }
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (o.greedy) return {arg, 0.f, static_cast<float>(logits[arg] - lse)};

  const double inv_t = 1.0 / o.temperature;
  int n = v;
  idx.resize(v);
  std::iota(idx.begin(), idx.end(), 0);
  auto desc = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (o.top_k > 0 && o.top_k < v) {
    std::partial_sort(idx.begin(), idx.begin() + o.top_k, idx.end(), desc);
    n = o.top_k;
  } else if (o.top_p < 1.f) {
    std::sort(idx.begin(), idx.end(), desc);
  }
  if (o.top_p < 1.f && o.top_k > 0 && o.top_k < v) {
    std::sort(idx.begin(), idx.begin() + n, desc);
  }
  prob.resize(n);
  const double zmax = mx * inv_t;  // the argmax is always a candidate
  double z = 0;
  for (int i = 0; i < n; ++i) {
    prob[i] = std::exp(logits[idx[i]] * inv_t - zmax);
    z += prob[i];
  }
  if (o.top_p < 1.f) {
    // Keep the smallest prefix (most likely first) whose mass reaches top_p.
    double cum = 0;
    int keep = 0;
    while (keep < n) {
      cum += prob[keep] / z;
      ++keep;
      if (cum >= o.top_p) break;
    }
    n = keep;
    z = 0;
    for (int i = 0; i < n; ++i) z += prob[i];
  }
  const double target = u * z;
  double acc = 0;
  int chosen = n - 1;
  for (int i = 0; i < n; ++i) {
    acc += prob[i];
    if (target < acc) { chosen = i; break; }
  }
  const int32_t tok = idx[chosen];
  return {tok, static_cast<float>(std::log(prob[chosen] / z)),
          static_cast<float>(logits[tok] - lse)};
}

}  // namespace

double SampleUniform(uint64_t seed, uint64_t sequence_id, uint64_t token_index) {
  const uint64_t h =
      SplitMix64(SplitMix64(SplitMix64(seed) ^ sequence_id) ^
                 (token_index * 0xd1342543de82ef95ull + 1));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

Generator::Generator(const ModelConfig& config, kernels::Ops* ops)
    : config_(config), layout_(config), ops_(ops) {
  C_ = config.hidden_size;
  H_ = config.num_attention_heads;
  Hkv_ = config.KvHeads();
  D_ = config.HeadDim();
  I_ = config.intermediate_size;
  V_ = config.vocab_size;
  L_ = config.num_hidden_layers;
  HD_ = H_ * D_;
  KD_ = Hkv_ * D_;
}

size_t Generator::kv_cache_bytes() const {
  size_t n = 0;
  for (const auto& c : kc_) n += c.size();
  for (const auto& c : vc_) n += c.size();
  return n * sizeof(float);
}

void Generator::Release() {
  kc_.clear(); vc_.clear();
  for (auto* vec : {&x_, &xn_, &q_, &k_, &v_, &attn_, &lse_, &gate_, &up_,
                    &h_, &hn_, &logits_, &cos_, &sin_}) {
    vec->clear();
    vec->shrink_to_fit();
  }
  cache_len_.clear();
  batch_cap_ = seq_cap_ = rows_cap_ = 0;
  rope_rows_ = 0;
  rope_key_ = -1;
}

void Generator::Ensure(int batch, int capacity, int rows) {
  if (batch > batch_cap_ || capacity > seq_cap_) {
    batch_cap_ = std::max(batch, batch_cap_);
    seq_cap_ = std::max(capacity, seq_cap_);
    kc_.assign(L_, {});
    vc_.assign(L_, {});
    const size_t n = static_cast<size_t>(batch_cap_) * seq_cap_ * KD_;
    for (int l = 0; l < L_; ++l) {
      kc_[l].assign(n, 0.f);
      vc_[l].assign(n, 0.f);
    }
    cache_len_.assign(batch_cap_, 0);
  }
  if (rows > rows_cap_) {
    rows_cap_ = rows;
    const size_t r = rows;
    x_.resize(r * C_); xn_.resize(r * C_); q_.resize(r * HD_);
    k_.resize(r * KD_); v_.resize(r * KD_); attn_.resize(r * HD_);
    lse_.resize(r * H_); gate_.resize(r * I_); up_.resize(r * I_);
    h_.resize(r * I_);
  }
  if (static_cast<int>(hn_.size()) < batch * C_) hn_.resize(static_cast<size_t>(batch) * C_);
  if (logits_.size() < static_cast<size_t>(batch) * V_) logits_.resize(static_cast<size_t>(batch) * V_);
  // Rotary tables for positions 0..capacity-1.
  const kernels::RopeConfig rc = config_.Rope();
  const int key = rc.type == kernels::RopeType::kDynamicNtk
                      ? std::max(capacity, rc.original_max_position)
                      : 0;
  if (key != rope_key_ || capacity > rope_rows_) {
    const int rowsr = std::max({capacity, config_.max_position_embeddings, rope_rows_});
    cos_.assign(static_cast<size_t>(rowsr) * D_ / 2, 0.f);
    sin_.assign(static_cast<size_t>(rowsr) * D_ / 2, 0.f);
    kernels::rope_tables(rc, key > 0 ? key : rowsr, rowsr, cos_.data(), sin_.data());
    rope_rows_ = rowsr;
    rope_key_ = key;
  }
}

void Generator::Forward(ParamProvider& pp, int rows, const int32_t* tokens,
                        const int32_t* positions, bool prefill,
                        const int32_t* cu, int num_seqs,
                        const std::vector<int>& out_rows) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const size_t cap_stride = static_cast<size_t>(seq_cap_) * KD_;
  {
    const float* P = pp.AcquireParams(0);
    pp.Prefetch(1);
    ops_->embedding_forward(tokens, rows, P + layout_.embed_offset(), C_, x_.data());
    pp.ReleaseParams(0);
  }
  for (int l = 0; l < L_; ++l) {
    const int unit = layout_.layer_unit(l);
    const float* P = pp.AcquireParams(unit);
    pp.Prefetch(unit + 1);
    const LayerOffsets& o = layout_.layer(l);
    kernels::AttentionParams ap;
    ap.num_heads = H_;
    ap.num_kv_heads = Hkv_;
    ap.head_dim = D_;
    ap.window = config_.LayerWindow(l);
    ops_->rmsnorm_forward(x_.data(), P + o.input_norm, rows, C_, eps, xn_.data(), lse_.data());
    ops_->matmul(false, true, rows, HD_, C_, 1.f, xn_.data(), C_, P + o.q, C_, 0.f, q_.data(), HD_);
    ops_->matmul(false, true, rows, KD_, C_, 1.f, xn_.data(), C_, P + o.k, C_, 0.f, k_.data(), KD_);
    ops_->matmul(false, true, rows, KD_, C_, 1.f, xn_.data(), C_, P + o.v, C_, 0.f, v_.data(), KD_);
    if (o.q_bias != SIZE_MAX) {
      ops_->add_bias(q_.data(), P + o.q_bias, rows, HD_);
      ops_->add_bias(k_.data(), P + o.k_bias, rows, KD_);
      ops_->add_bias(v_.data(), P + o.v_bias, rows, KD_);
    }
    ops_->rope_apply(q_.data(), positions, rows, H_, D_, cos_.data(), sin_.data(), false);
    ops_->rope_apply(k_.data(), positions, rows, Hkv_, D_, cos_.data(), sin_.data(), false);
    float* kc = kc_[l].data();
    float* vc = vc_[l].data();
    if (prefill) {
      for (int s = 0; s < num_seqs; ++s) {
        const size_t n = static_cast<size_t>(cu[s + 1] - cu[s]) * KD_;
        std::memcpy(kc + s * cap_stride, k_.data() + static_cast<size_t>(cu[s]) * KD_, n * 4);
        std::memcpy(vc + s * cap_stride, v_.data() + static_cast<size_t>(cu[s]) * KD_, n * 4);
      }
      ops_->attention_forward(ap, q_.data(), k_.data(), v_.data(), cu, num_seqs, rows,
                              attn_.data(), lse_.data());
    } else {
      for (int r = 0; r < rows; ++r) {
        const size_t at = r * cap_stride + static_cast<size_t>(positions[r]) * KD_;
        std::memcpy(kc + at, k_.data() + static_cast<size_t>(r) * KD_, KD_ * 4);
        std::memcpy(vc + at, v_.data() + static_cast<size_t>(r) * KD_, KD_ * 4);
      }
      ops_->decode_attention(ap, q_.data(), rows, 1, kc, vc, seq_cap_,
                             cache_len_.data(), attn_.data());
    }
    ops_->matmul(false, true, rows, C_, HD_, 1.f, attn_.data(), HD_, P + o.o, HD_, 1.f, x_.data(), C_);
    ops_->rmsnorm_forward(x_.data(), P + o.post_norm, rows, C_, eps, xn_.data(), lse_.data());
    ops_->matmul(false, true, rows, I_, C_, 1.f, xn_.data(), C_, P + o.gate, C_, 0.f, gate_.data(), I_);
    ops_->matmul(false, true, rows, I_, C_, 1.f, xn_.data(), C_, P + o.up, C_, 0.f, up_.data(), I_);
    ops_->swiglu_forward(gate_.data(), up_.data(), static_cast<size_t>(rows) * I_, h_.data());
    ops_->matmul(false, true, rows, C_, I_, 1.f, h_.data(), I_, P + o.down, I_, 1.f, x_.data(), C_);
    pp.ReleaseParams(unit);
  }
  const int n_out = static_cast<int>(out_rows.size());
  for (int i = 0; i < n_out; ++i) {
    std::memcpy(xn_.data() + static_cast<size_t>(i) * C_,
                x_.data() + static_cast<size_t>(out_rows[i]) * C_, C_ * 4);
  }
  const int fu = layout_.final_unit();
  const float* P = pp.AcquireParams(fu);
  ops_->rmsnorm_forward(xn_.data(), P + layout_.final_norm_offset(), n_out, C_, eps,
                        hn_.data(), lse_.data());
  const int hu = layout_.lm_head_unit();
  const float* W = hu == fu ? P : pp.AcquireParams(hu);
  ops_->matmul(false, true, n_out, V_, C_, 1.f, hn_.data(), C_, W + layout_.lm_head_offset(),
               C_, 0.f, logits_.data(), V_);
  if (hu != fu) pp.ReleaseParams(hu);
  pp.ReleaseParams(fu);
}

absl::StatusOr<GenerationResult> Generator::Generate(
    const std::vector<std::vector<int32_t>>& prompts,
    const SamplingOptions& o, ParamProvider& pp,
    std::span<const uint64_t> sequence_ids) {
  const int B = static_cast<int>(prompts.size());
  if (B == 0) return absl::InvalidArgumentError("generate: no prompts");
  if (!sequence_ids.empty() && static_cast<int>(sequence_ids.size()) != B) {
    return absl::InvalidArgumentError("generate: sequence_ids must match the prompts");
  }
  if (o.max_new_tokens < 0) return absl::InvalidArgumentError("generate: max_new_tokens < 0");
  if (!o.greedy && !(o.temperature > 0.f)) {
    return absl::InvalidArgumentError("generate: temperature must be > 0 (or use greedy)");
  }
  if (!(o.top_p > 0.f && o.top_p <= 1.f)) {
    return absl::InvalidArgumentError("generate: top_p must be in (0, 1]");
  }
  if (o.top_k < 0) return absl::InvalidArgumentError("generate: top_k must be >= 0");
  int max_len = 0;
  int64_t total = 0;
  for (int b = 0; b < B; ++b) {
    if (prompts[b].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("generate: prompt ", b, " is empty"));
    }
    for (int32_t id : prompts[b]) {
      if (id < 0 || id >= V_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "generate: prompt ", b, " has token id ", id, " outside [0, ", V_, ")"));
      }
    }
    max_len = std::max<int>(max_len, prompts[b].size());
    total += prompts[b].size();
  }
  const int capacity = max_len + std::max(o.max_new_tokens, 1);
  if (capacity > (1 << 22) || total > (1 << 24)) {
    return absl::InvalidArgumentError("generate: prompts too long");
  }
  Ensure(B, capacity, static_cast<int>(std::max<int64_t>(total, B)));

  GenerationResult res;
  res.sequences.resize(B);
  res.prompt_tokens = total;
  std::vector<int32_t> stop = o.stop_ids;
  if (o.stop_at_eos) stop.insert(stop.end(), config_.eos_token_ids.begin(), config_.eos_token_ids.end());
  auto is_stop = [&](int32_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); };

  // Prefill.
  double t0 = Now();
  std::vector<int32_t> tokens, positions, cu = {0};
  tokens.reserve(total);
  positions.reserve(total);
  std::vector<int> out_rows;
  for (int b = 0; b < B; ++b) {
    for (size_t i = 0; i < prompts[b].size(); ++i) {
      tokens.push_back(prompts[b][i]);
      positions.push_back(static_cast<int32_t>(i));
    }
    cu.push_back(static_cast<int32_t>(tokens.size()));
    out_rows.push_back(cu.back() - 1);
    cache_len_[b] = static_cast<int32_t>(prompts[b].size());
  }
  if (o.max_new_tokens == 0) {
    res.kv_cache_bytes = kv_cache_bytes();
    return res;
  }
  Forward(pp, static_cast<int>(total), tokens.data(), positions.data(), true, cu.data(), B, out_rows);
  res.prefill_seconds = Now() - t0;
  t0 = Now();

  // slot s holds sequence seq_of[s]; live slots are 0..live-1.
  std::vector<int> seq_of(B);
  std::iota(seq_of.begin(), seq_of.end(), 0);
  int live = B;
  std::vector<int32_t> idx;
  std::vector<double> prob;
  std::vector<int32_t> next(B), pos(B);
  const size_t cap_stride = static_cast<size_t>(seq_cap_) * KD_;
  for (int step = 0; live > 0; ++step) {
    // Sample one token per live slot from logits_ rows 0..live-1.
    for (int s = 0; s < live; ++s) {
      const int b = seq_of[s];
      const uint64_t sid = sequence_ids.empty() ? static_cast<uint64_t>(b) : sequence_ids[b];
      const double u = SampleUniform(o.seed, sid, static_cast<uint64_t>(step));
      Pick p = SampleRow(logits_.data() + static_cast<size_t>(s) * V_, V_, o, u, idx, prob);
      GeneratedSequence& g = res.sequences[b];
      g.tokens.push_back(p.token);
      g.logprobs.push_back(p.logprob);
      g.raw_logprobs.push_back(p.raw_logprob);
      next[s] = p.token;
      if (is_stop(p.token)) {
        g.finish = FinishReason::kStop;
      } else if (static_cast<int>(g.tokens.size()) >= o.max_new_tokens) {
        g.finish = FinishReason::kLength;
      } else {
        continue;
      }
      next[s] = -1;  // finished
    }
    // Compact: move live slots down over finished ones (copying caches).
    int w = 0;
    for (int s = 0; s < live; ++s) {
      if (next[s] < 0) continue;
      if (w != s) {
        const size_t n = static_cast<size_t>(cache_len_[s]) * KD_;
        for (int l = 0; l < L_; ++l) {
          std::memmove(kc_[l].data() + w * cap_stride, kc_[l].data() + s * cap_stride, n * 4);
          std::memmove(vc_[l].data() + w * cap_stride, vc_[l].data() + s * cap_stride, n * 4);
        }
        cache_len_[w] = cache_len_[s];
        seq_of[w] = seq_of[s];
        next[w] = next[s];
      }
      ++w;
    }
    live = w;
    if (live == 0) break;
    for (int s = 0; s < live; ++s) {
      pos[s] = cache_len_[s];
      cache_len_[s] += 1;
    }
    out_rows.resize(live);
    std::iota(out_rows.begin(), out_rows.end(), 0);
    Forward(pp, live, next.data(), pos.data(), false, nullptr, live, out_rows);
  }
  res.decode_seconds = Now() - t0;
  for (const auto& g : res.sequences) res.generated_tokens += g.tokens.size();
  res.kv_cache_bytes = kv_cache_bytes();
  return res;
}

}  // namespace tandem::model
