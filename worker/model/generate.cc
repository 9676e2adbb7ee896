#include "worker/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <numeric>
#include <utility>

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

Generator::Generator(const ModelConfig& config, kernels::Ops* ops,
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
}

size_t Generator::kv_cache_bytes() const {
  size_t n = 0;
  for (const auto& c : kc_) n += c.bytes();
  for (const auto& c : vc_) n += c.bytes();
  return n;
}

void Generator::Release() {
  kc_.clear();
  vc_.clear();
  for (auto* a : {&x_, &xn_, &q_, &k_, &v_, &attn_, &lse_, &gate_, &up_, &h_,
                  &hn_, &logits_d_, &cos_d_, &sin_d_, &kraw_}) {
    a->reset();
  }
  idx_d_.reset();
  u_d_.reset();
  pick_id_d_.reset();
  pick_lp_d_.reset();
  for (auto* vec : {&logits_, &cos_, &sin_}) {
    vec->clear();
    vec->shrink_to_fit();
  }
  idx_host_.clear();
  idx_host_.shrink_to_fit();
  cache_len_.clear();
  batch_cap_ = seq_cap_ = rows_cap_ = out_cap_ = 0;
  rope_rows_ = 0;
  rope_key_ = -1;
}

absl::Status Generator::Ensure(int batch, int capacity, int rows) {
  auto exhausted = [this](const char* what, size_t bytes) {
    Release();
    return absl::ResourceExhaustedError(absl::StrCat(
        "generate: cannot allocate ", bytes, " bytes of ", what, " in ",
        mem_->name(), " memory"));
  };
  if (batch > batch_cap_ || capacity > seq_cap_) {
    batch_cap_ = std::max(batch, batch_cap_);
    seq_cap_ = std::max(capacity, seq_cap_);
    kc_.clear();  // free the old caches first
    vc_.clear();
    kc_.resize(L_);
    vc_.resize(L_);
    const size_t n = static_cast<size_t>(batch_cap_) * seq_cap_ * KD_;
    for (int l = 0; l < L_; ++l) {
      if (!kc_[l].Allocate(mem_, n) || !vc_[l].Allocate(mem_, n)) {
        return exhausted("KV cache", 2 * L_ * n * sizeof(float));
      }
    }
    cache_len_.assign(batch_cap_, 0);
  }
  if (rows > rows_cap_) {
    const size_t r = rows;
    bool ok = true;
    using Buffer = std::pair<kernels::DeviceArray<float>*, int>;
    const Buffer buffers[] = {{&x_, C_},    {&xn_, C_},   {&q_, HD_},
                              {&k_, KD_},   {&v_, KD_},   {&attn_, HD_},
                              {&lse_, H_},  {&gate_, I_}, {&up_, I_},
                              {&h_, I_}};
    for (const auto& [a, width] : buffers) {
      ok = ok && a->Allocate(mem_, r * static_cast<size_t>(width));
    }
    const bool qk_norm = config_.HasQkNorm();
    if (qk_norm) ok = ok && kraw_.Allocate(mem_, r * static_cast<size_t>(KD_));
    if (!ok) {
      return exhausted("activations",
                       r * (3 * C_ + 2 * HD_ + (qk_norm ? 3 : 2) * KD_ + H_ + 3 * I_) *
                           sizeof(float));
    }
    rows_cap_ = rows;
  }
  if (batch > out_cap_) {
    const size_t b = batch;
    if (!hn_.Allocate(mem_, b * C_) || !logits_d_.Allocate(mem_, b * V_) ||
        !u_d_.Allocate(mem_, b) || !pick_id_d_.Allocate(mem_, b) || !pick_lp_d_.Allocate(mem_, 2 * b)) {
      return exhausted("logits", b * (C_ + V_ + 5) * sizeof(float));
    }
    out_cap_ = batch;
    u_host_.resize(b);
    pick_id_host_.resize(b);
    pick_lp_host_.resize(2 * b);
  }
  // Indices (Generate): prefill 3 x [rows] + [batch] + [batch + 1], decode
  // 4 x [live <= batch].
  const size_t idx_n = 3 * static_cast<size_t>(rows_cap_) + 2 * static_cast<size_t>(out_cap_) + 1;
  if (idx_d_.size() < idx_n) {
    if (!idx_d_.Allocate(mem_, idx_n)) return exhausted("indices", idx_n * sizeof(int32_t));
  }
  if (idx_host_.capacity() < idx_n) idx_host_.reserve(idx_n);
  // Rotary tables for positions 0..capacity-1.
  const kernels::RopeConfig rc = config_.Rope();
  const int key = rc.type == kernels::RopeType::kDynamicNtk
                      ? std::max(capacity, rc.original_max_position)
                      : 0;
  if (key != rope_key_ || capacity > rope_rows_) {
    const int rowsr = std::max(RopeRowsFor(capacity), rope_rows_);
    const size_t n = static_cast<size_t>(rowsr) * D_ / 2;
    cos_.assign(n, 0.f);
    sin_.assign(n, 0.f);
    kernels::rope_tables(rc, key > 0 ? key : rowsr, rowsr, cos_.data(), sin_.data());
    if (cos_d_.size() < n || sin_d_.size() < n) {
      cos_d_.reset();
      sin_d_.reset();
      if (!cos_d_.Allocate(mem_, n) || !sin_d_.Allocate(mem_, n)) {
        return exhausted("rope tables", 2 * n * sizeof(float));
      }
    }
    cos_d_.Upload(cos_.data(), n);
    sin_d_.Upload(sin_.data(), n);
    rope_rows_ = rowsr;
    rope_key_ = key;
  }
  if (!mem_->ok()) {
    return absl::InternalError(absl::StrCat("generate: device memory (", mem_->name(),
                                            "): ", mem_->last_error()));
  }
  return absl::OkStatus();
}

void Generator::UploadIndices(size_t n) { idx_d_.Upload(idx_host_.data(), n); }

void Generator::Forward(ParamProvider& pp, int rows, const StepIndices& ix,
                        int num_seqs, int n_out) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool prefill = ix.cu != nullptr;
  float* x = x_.data();
  float* xn = xn_.data();
  float* q = q_.data();
  float* k = k_.data();
  float* v = v_.data();
  float* attn = attn_.data();
  float* lse = lse_.data();
  float* gate = gate_.data();
  float* up = up_.data();
  float* h = h_.data();
  const float* cosb = cos_d_.data();
  const float* sinb = sin_d_.data();
  {
    const float* P = pp.AcquireParams(0);
    pp.Prefetch(1);
    ops_->embedding_forward(ix.tokens, rows, P + layout_.embed_offset(), C_, x);
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
    ops_->rmsnorm_forward(x, P + o.input_norm, rows, C_, eps, xn, lse);
    // With q/k norms the projections go to attn (free until the attention)
    // and kraw_, then the per-head norms write q and k (rstd into lse,
    // unused).
    const bool qk_norm = o.q_norm != SIZE_MAX;
    float* qp = qk_norm ? attn : q;
    float* kp = qk_norm ? kraw_.data() : k;
    ops_->matmul(false, true, rows, HD_, C_, 1.f, xn, C_, P + o.q, C_, 0.f, qp, HD_);
    ops_->matmul(false, true, rows, KD_, C_, 1.f, xn, C_, P + o.k, C_, 0.f, kp, KD_);
    ops_->matmul(false, true, rows, KD_, C_, 1.f, xn, C_, P + o.v, C_, 0.f, v, KD_);
    if (o.q_bias != SIZE_MAX) {
      ops_->add_bias(qp, P + o.q_bias, rows, HD_);
      ops_->add_bias(kp, P + o.k_bias, rows, KD_);
      ops_->add_bias(v, P + o.v_bias, rows, KD_);
    }
    if (qk_norm) {
      ops_->rmsnorm_forward(qp, P + o.q_norm, rows * H_, D_, eps, q, lse);
      ops_->rmsnorm_forward(kp, P + o.k_norm, rows * Hkv_, D_, eps, k, lse);
    }
    ops_->rope_apply(q, ix.positions, rows, H_, D_, cosb, sinb, false);
    ops_->rope_apply(k, ix.positions, rows, Hkv_, D_, cosb, sinb, false);
    // Write the new k/v rows into the caches: a scatter over cache rows
    // [batch * seq_cap, KD], whose target rows are zero (see Generate), so
    // the scatter-add is a copy.
    float* kc = kc_[l].data();
    float* vc = vc_[l].data();
    ops_->embedding_backward(ix.kv_rows, rows, k, KD_, kc);
    ops_->embedding_backward(ix.kv_rows, rows, v, KD_, vc);
    if (prefill) {
      ops_->attention_forward(ap, q, k, v, ix.cu, num_seqs, rows, attn, lse);
    } else {
      ops_->decode_attention(ap, q, rows, 1, kc, vc, seq_cap_, ix.cache_len, attn);
    }
    ops_->matmul(false, true, rows, C_, HD_, 1.f, attn, HD_, P + o.o, HD_, 1.f, x, C_);
    ops_->rmsnorm_forward(x, P + o.post_norm, rows, C_, eps, xn, lse);
    ops_->matmul(false, true, rows, I_, C_, 1.f, xn, C_, P + o.gate, C_, 0.f, gate, I_);
    ops_->matmul(false, true, rows, I_, C_, 1.f, xn, C_, P + o.up, C_, 0.f, up, I_);
    ops_->swiglu_forward(gate, up, static_cast<size_t>(rows) * I_, h);
    ops_->matmul(false, true, rows, C_, I_, 1.f, h, I_, P + o.down, I_, 1.f, x, C_);
    pp.ReleaseParams(unit);
  }
  // The output rows: a gather into xn, or rows 0..n_out-1 of x in place.
  const float* xo = x;
  if (ix.out_rows != nullptr) {
    ops_->embedding_forward(ix.out_rows, n_out, x, C_, xn);
    xo = xn;
  }
  const int fu = layout_.final_unit();
  const float* P = pp.AcquireParams(fu);
  ops_->rmsnorm_forward(xo, P + layout_.final_norm_offset(), n_out, C_, eps,
                        hn_.data(), lse);
  const int hu = layout_.lm_head_unit();
  const float* W = hu == fu ? P : pp.AcquireParams(hu);
  ops_->matmul(false, true, n_out, V_, C_, 1.f, hn_.data(), C_, W + layout_.lm_head_offset(),
               C_, 0.f, logits_d_.data(), V_);
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
  // In 64 bits: max_new_tokens may be anything up to INT_MAX.
  const int64_t wanted = int64_t{max_len} + std::max(o.max_new_tokens, 1);
  if (wanted > (1 << 22)) {
    return absl::InvalidArgumentError(absl::StrCat("generate: prompt (", max_len, " tokens) + max_new_tokens (",
                                                   o.max_new_tokens, ") is more than ", 1 << 22, " positions"));
  }
  const int capacity = static_cast<int>(wanted);
  // Per-head rows (lse, q/k norms) are indexed with 32-bit ints.
  if (total > (1 << 24) || total * H_ > INT32_MAX ||
      static_cast<int64_t>(std::max(B, batch_cap_)) * std::max(capacity, seq_cap_) >=
          (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("generate: prompts too long");
  }
  absl::Status st = Ensure(B, capacity, static_cast<int>(std::max<int64_t>(total, B)));
  if (!st.ok()) return st;
  auto memory_status = [this]() {
    return mem_->ok() ? absl::OkStatus()
                      : absl::InternalError(absl::StrCat("generate: device memory (",
                                                         mem_->name(), "): ",
                                                         mem_->last_error()));
  };

  GenerationResult res;
  res.sequences.resize(B);
  res.prompt_tokens = total;
  std::vector<int32_t> stop = o.stop_ids;
  if (o.stop_at_eos) stop.insert(stop.end(), config_.eos_token_ids.begin(), config_.eos_token_ids.end());
  auto is_stop = [&](int32_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); };

  // Prefill. The caches of slots 0..B-1 start zeroed: rows at and past a
  // slot's cache length stay zero (see Forward), here and when compacting.
  double t0 = Now();
  const size_t cap_stride = static_cast<size_t>(seq_cap_) * KD_;
  // idx_host_ = [tokens | positions | kv rows (total each) | out rows B | cu B+1].
  idx_host_.resize(3 * total + 2 * B + 1);
  int32_t* h_tokens = idx_host_.data();
  int32_t* h_positions = h_tokens + total;
  int32_t* h_kv_rows = h_positions + total;
  int32_t* h_out_rows = h_kv_rows + total;
  int32_t* h_cu = h_out_rows + B;
  h_cu[0] = 0;
  for (int b = 0, t = 0; b < B; ++b) {
    for (size_t i = 0; i < prompts[b].size(); ++i, ++t) {
      h_tokens[t] = prompts[b][i];
      h_positions[t] = static_cast<int32_t>(i);
      h_kv_rows[t] = b * seq_cap_ + static_cast<int32_t>(i);
    }
    h_cu[b + 1] = t;
    h_out_rows[b] = t - 1;
    cache_len_[b] = static_cast<int32_t>(prompts[b].size());
  }
  if (o.max_new_tokens == 0) {
    res.kv_cache_bytes = kv_cache_bytes();
    return res;
  }
  for (int l = 0; l < L_; ++l) {
    mem_->SetZero(kc_[l].data(), B * cap_stride * sizeof(float));
    mem_->SetZero(vc_[l].data(), B * cap_stride * sizeof(float));
  }
  UploadIndices(idx_host_.size());
  {
    const int32_t* d = idx_d_.data();
    StepIndices ix;
    ix.tokens = d;
    ix.positions = d + total;
    ix.kv_rows = d + 2 * total;
    ix.out_rows = d + 3 * total;
    ix.cu = d + 3 * total + B;
    Forward(pp, static_cast<int>(total), ix, B, B);
  }
  res.prefill_seconds = Now() - t0;
  t0 = Now();

  // slot s holds sequence seq_of[s]; live slots are 0..live-1.
  std::vector<int> seq_of(B);
  std::iota(seq_of.begin(), seq_of.end(), 0);
  int live = B;
  std::vector<int32_t> idx;
  std::vector<double> prob;
  std::vector<int32_t> next(B);
  std::vector<Pick> picks(B);
  // Without top-k / top-p the backend samples on the device and only ids and
  // log-probs come back; otherwise the logits are sorted on the host.
  const bool device_sampling = o.greedy || ((o.top_k <= 0 || o.top_k >= V_) && o.top_p >= 1.f);
  for (int step = 0; live > 0; ++step) {
    // Sample one token per live slot from the logits of rows 0..live-1.
    for (int s = 0; s < live; ++s) {
      const int b = seq_of[s];
      const uint64_t sid = sequence_ids.empty() ? static_cast<uint64_t>(b) : sequence_ids[b];
      u_host_[s] = o.greedy ? 0.0 : SampleUniform(o.seed, sid, static_cast<uint64_t>(step));
    }
    if (device_sampling) {
      u_d_.Upload(u_host_.data(), live);
      ops_->sample_logits(logits_d_.data(), live, V_, o.greedy ? 0.f : o.temperature, u_d_.data(),
                          pick_id_d_.data(), pick_lp_d_.data(), pick_lp_d_.data() + live);
      pick_id_d_.Download(pick_id_host_.data(), live);
      pick_lp_d_.Download(pick_lp_host_.data(), 2 * static_cast<size_t>(live));
      for (int s = 0; s < live; ++s) {
        picks[s] = {pick_id_host_[s], pick_lp_host_[s], pick_lp_host_[live + s]};
      }
    } else {
      if (logits_.size() < static_cast<size_t>(live) * V_) logits_.resize(static_cast<size_t>(B) * V_);
      logits_d_.Download(logits_.data(), static_cast<size_t>(live) * V_);
      for (int s = 0; s < live; ++s) {
        picks[s] = SampleRow(logits_.data() + static_cast<size_t>(s) * V_, V_, o, u_host_[s], idx, prob);
      }
    }
    for (int s = 0; s < live; ++s) {
      const int b = seq_of[s];
      const Pick& p = picks[s];
      GeneratedSequence& g = res.sequences[b];
      g.tokens.push_back(p.token);
      g.logprobs.push_back(p.logprob);
      g.raw_logprobs.push_back(p.raw_logprob);
      next[s] = p.token;
      if (is_stop(p.token) || (o.stop_check && o.stop_check(static_cast<size_t>(b), p.token))) {
        g.finish = FinishReason::kStop;
      } else if (static_cast<int>(g.tokens.size()) >= o.max_new_tokens) {
        g.finish = FinishReason::kLength;
      } else {
        continue;
      }
      next[s] = -1;  // finished
    }
    // Compact: move live slots down over finished ones (copying caches, and
    // zeroing what is left of the destination's old rows).
    int w = 0;
    for (int s = 0; s < live; ++s) {
      if (next[s] < 0) continue;
      if (w != s) {
        // Slots are cap_stride apart and w < s: the ranges do not overlap.
        const size_t n = static_cast<size_t>(cache_len_[s]) * KD_;
        const size_t old = static_cast<size_t>(cache_len_[w]) * KD_;
        for (int l = 0; l < L_; ++l) {
          for (float* c : {kc_[l].data(), vc_[l].data()}) {
            mem_->CopyOnDevice(c + w * cap_stride, c + s * cap_stride, n * sizeof(float));
            if (old > n) mem_->SetZero(c + w * cap_stride + n, (old - n) * sizeof(float));
          }
        }
        cache_len_[w] = cache_len_[s];
        seq_of[w] = seq_of[s];
        next[w] = next[s];
      }
      ++w;
    }
    live = w;
    if (live == 0) break;
    // idx_host_ = [tokens | positions | kv rows | cache lengths] (live each).
    idx_host_.resize(4 * static_cast<size_t>(live));
    int32_t* h = idx_host_.data();
    for (int s = 0; s < live; ++s) {
      h[s] = next[s];
      h[live + s] = cache_len_[s];
      h[2 * live + s] = s * seq_cap_ + cache_len_[s];
      cache_len_[s] += 1;
      h[3 * live + s] = cache_len_[s];
    }
    UploadIndices(idx_host_.size());
    const int32_t* d = idx_d_.data();
    StepIndices ix;
    ix.tokens = d;
    ix.positions = d + live;
    ix.kv_rows = d + 2 * live;
    ix.cache_len = d + 3 * live;
    Forward(pp, live, ix, live, live);
  }
  st = memory_status();
  if (!st.ok()) return st;
  res.decode_seconds = Now() - t0;
  for (const auto& g : res.sequences) res.generated_tokens += g.tokens.size();
  res.kv_cache_bytes = kv_cache_bytes();
  return res;
}

}  // namespace tandem::model
