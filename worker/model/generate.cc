#include "worker/model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::model {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Picks a token from one row of logits; returns (token, sampling logprob,
// raw logprob). `idx` and `prob` are scratch of V entries.
struct Pick {
  int32_t token;
  float logprob;
  float raw_logprob;
};

Pick SampleRow(const float* logits, int v, const SamplingOptions& o, double u, std::vector<int32_t>& idx,
               std::vector<double>& prob) {
  double mx = -INFINITY;
  int32_t arg = 0;
  for (int i = 0; i < v; ++i) {
    if (logits[i] > mx) {
      mx = logits[i];
      arg = i;
    }
  }
  double sum = 0;
  for (int i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (o.greedy) return {arg, 0.f, static_cast<float>(logits[arg] - lse)};

  const double inv_t = 1.0 / o.temperature;
  int n = v;
  idx.resize(v);
  std::iota(idx.begin(), idx.end(), 0);
  auto desc = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
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
    if (target < acc) {
      chosen = i;
      break;
    }
  }
  const int32_t tok = idx[chosen];
  return {tok, static_cast<float>(std::log(prob[chosen] / z)), static_cast<float>(logits[tok] - lse)};
}

}  // namespace

double SampleUniform(uint64_t seed, uint64_t sequence_id, uint64_t token_index) {
  const uint64_t h = SplitMix64(SplitMix64(SplitMix64(seed) ^ sequence_id) ^ (token_index * 0xd1342543de82ef95ull + 1));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

Generator::Generator(const ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory)
    : decoder_(config, ops, memory), d_(decoder_.dims()), ops_(ops), mem_(decoder_.memory()) {}

size_t Generator::kv_cache_bytes() const {
  size_t n = 0;
  for (const auto& c : kc_) n += c.bytes();
  for (const auto& c : vc_) n += c.bytes();
  return n;
}

void Generator::Release() {
  kc_.clear();
  vc_.clear();
  for (auto* a : {&x_, &xn_, &q_, &k_, &v_, &attn_, &lse_, &gate_, &up_, &h_, &hn_, &logits_d_, &kraw_}) {
    a->reset();
  }
  idx_d_.reset();
  u_d_.reset();
  pick_id_d_.reset();
  pick_lp_d_.reset();
  logits_.clear();
  logits_.shrink_to_fit();
  idx_host_.clear();
  idx_host_.shrink_to_fit();
  cache_len_.clear();
  batch_cap_ = seq_cap_ = rows_cap_ = out_cap_ = 0;
  decoder_.ReleaseRope();
}

absl::Status Generator::Ensure(int batch, int capacity, int rows) {
  auto exhausted = [this](const char* what, size_t bytes) {
    Release();
    return absl::ResourceExhaustedError(
        absl::StrCat("generate: cannot allocate ", bytes, " bytes of ", what, " in ", mem_->name(), " memory"));
  };
  if (batch > batch_cap_ || capacity > seq_cap_) {
    batch_cap_ = std::max(batch, batch_cap_);
    seq_cap_ = std::max(capacity, seq_cap_);
    kc_.clear();  // free the old caches first
    vc_.clear();
    kc_.resize(d_.L);
    vc_.resize(d_.L);
    const size_t n = static_cast<size_t>(batch_cap_) * seq_cap_ * d_.KD;
    for (int l = 0; l < d_.L; ++l) {
      if (!kc_[l].Allocate(mem_, n) || !vc_[l].Allocate(mem_, n)) {
        return exhausted("KV cache", 2 * d_.L * n * sizeof(float));
      }
    }
    cache_len_.assign(batch_cap_, 0);
  }
  if (rows > rows_cap_) {
    const size_t r = rows;
    bool ok = true;
    using Buffer = std::pair<kernels::DeviceArray<float>*, int>;
    const Buffer buffers[] = {{&x_, d_.C},     {&xn_, d_.C},  {&q_, d_.HD},   {&k_, d_.KD}, {&v_, d_.KD},
                              {&attn_, d_.HD}, {&lse_, d_.H}, {&gate_, d_.I}, {&up_, d_.I}, {&h_, d_.I}};
    for (const auto& [a, width] : buffers) {
      ok = ok && a->Allocate(mem_, r * static_cast<size_t>(width));
    }
    const bool qk_norm = config().HasQkNorm();
    if (qk_norm) ok = ok && kraw_.Allocate(mem_, r * static_cast<size_t>(d_.KD));
    if (!ok) {
      const size_t width = 3 * d_.C + 2 * d_.HD + (qk_norm ? 3 : 2) * d_.KD + d_.H + 3 * d_.I;
      return exhausted("activations", r * width * sizeof(float));
    }
    rows_cap_ = rows;
  }
  if (batch > out_cap_) {
    const size_t b = batch;
    if (!hn_.Allocate(mem_, b * d_.C) || !logits_d_.Allocate(mem_, b * d_.V) || !u_d_.Allocate(mem_, b) ||
        !pick_id_d_.Allocate(mem_, b) || !pick_lp_d_.Allocate(mem_, 2 * b)) {
      return exhausted("logits", b * (d_.C + d_.V + 5) * sizeof(float));
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
  if (absl::Status st = decoder_.EnsureRope(capacity); !st.ok()) {
    Release();
    return st;
  }
  return decoder_.MemoryStatus("generate");
}

void Generator::UploadIndices(size_t n) { idx_d_.Upload(idx_host_.data(), n); }

void Generator::Step(ParamProvider& pp, DecoderInput in, const int32_t* out_rows, int n_out) {
  const KvCache cache{kc_, vc_, seq_cap_};
  in.cache = &cache;
  // One scratch per activation, reused by every layer; the residual is
  // updated in place. lse_ doubles as the RMSNorms' rstd output (unused)
  // and attn_ holds q before its norm (free until the attention).
  float* lse = lse_.data();
  DecoderActivations a;
  a.x = a.xmid = {x_.data(), 0};
  a.q = {q_.data(), 0};
  a.k = {k_.data(), 0};
  a.v = {v_.data(), 0};
  a.attn = a.q_raw = {attn_.data(), 0};
  a.lse = a.rstd_in = a.rstd_post = a.rstd_q = a.rstd_k = {lse, 0};
  a.k_raw = {kraw_.data(), 0};
  a.gate = {gate_.data(), 0};
  a.up = {up_.data(), 0};
  a.xn = xn_.data();
  a.hact = h_.data();
  DecoderOutput out;
  out.rows = n_out;
  out.select = out_rows;
  out.xn = hn_.data();
  out.rstd = lse;
  decoder_.Forward(pp, in, a, out);
  decoder_.Logits(pp, hn_.data(), n_out, logits_d_.data());
}

absl::StatusOr<GenerationResult> Generator::Generate(const std::vector<std::vector<int32_t>>& prompts,
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
  for (int l = 0; l < d_.L; ++l) {
    const LayerType& t = decoder_.layer_type(l);
    if (t.kind == LayerKind::kLinear || t.kind == LayerKind::kSinkWindow) {
      return absl::UnimplementedError(absl::StrCat("generate: layer ", l, " is '", LayerTypeName(t),
                                                   "'; this generator keeps a KV cache per layer, such layers decode "
                                                   "with a per-layer state (worker/model/layer_state.h)"));
    }
  }
  int max_len = 0;
  int64_t total = 0;
  for (int b = 0; b < B; ++b) {
    if (prompts[b].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("generate: prompt ", b, " is empty"));
    }
    for (int32_t id : prompts[b]) {
      if (id < 0 || id >= d_.V) {
        return absl::InvalidArgumentError(
            absl::StrCat("generate: prompt ", b, " has token id ", id, " outside [0, ", d_.V, ")"));
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
  if (total > (1 << 24) || total * d_.H > INT32_MAX ||
      static_cast<int64_t>(std::max(B, batch_cap_)) * std::max(capacity, seq_cap_) >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("generate: prompts too long");
  }
  RETURN_IF_ERROR(Ensure(B, capacity, static_cast<int>(std::max<int64_t>(total, B))));

  GenerationResult res;
  res.sequences.resize(B);
  res.prompt_tokens = total;
  std::vector<int32_t> stop = o.stop_ids;
  if (o.stop_at_eos) stop.insert(stop.end(), config().eos_token_ids.begin(), config().eos_token_ids.end());
  auto is_stop = [&](int32_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); };

  // Prefill. The caches of slots 0..B-1 start zeroed: rows at and past a
  // slot's cache length stay zero (KvCache, decoder.h), here and when
  // compacting.
  double t0 = Now();
  const size_t cap_stride = static_cast<size_t>(seq_cap_) * d_.KD;
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
  for (int l = 0; l < d_.L; ++l) {
    mem_->SetZero(kc_[l].data(), B * cap_stride * sizeof(float));
    mem_->SetZero(vc_[l].data(), B * cap_stride * sizeof(float));
  }
  UploadIndices(idx_host_.size());
  {
    const int32_t* d = idx_d_.data();
    DecoderInput in;
    in.rows = static_cast<int>(total);
    in.tokens = d;
    in.positions = d + total;
    in.kv_rows = d + 2 * total;
    in.cu = d + 3 * total + B;
    in.num_seqs = B;
    Step(pp, in, /*out_rows=*/d + 3 * total, B);
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
  const bool device_sampling = o.greedy || ((o.top_k <= 0 || o.top_k >= d_.V) && o.top_p >= 1.f);
  for (int step = 0; live > 0; ++step) {
    // Sample one token per live slot from the logits of rows 0..live-1.
    for (int s = 0; s < live; ++s) {
      const int b = seq_of[s];
      const uint64_t sid = sequence_ids.empty() ? static_cast<uint64_t>(b) : sequence_ids[b];
      u_host_[s] = o.greedy ? 0.0 : SampleUniform(o.seed, sid, static_cast<uint64_t>(step));
    }
    if (device_sampling) {
      u_d_.Upload(u_host_.data(), live);
      ops_->sample_logits(logits_d_.data(), live, d_.V, o.greedy ? 0.f : o.temperature, u_d_.data(), pick_id_d_.data(),
                          pick_lp_d_.data(), pick_lp_d_.data() + live);
      pick_id_d_.Download(pick_id_host_.data(), live);
      pick_lp_d_.Download(pick_lp_host_.data(), 2 * static_cast<size_t>(live));
      for (int s = 0; s < live; ++s) {
        picks[s] = {pick_id_host_[s], pick_lp_host_[s], pick_lp_host_[live + s]};
      }
    } else {
      if (logits_.size() < static_cast<size_t>(live) * d_.V) logits_.resize(static_cast<size_t>(B) * d_.V);
      logits_d_.Download(logits_.data(), static_cast<size_t>(live) * d_.V);
      for (int s = 0; s < live; ++s) {
        picks[s] = SampleRow(logits_.data() + static_cast<size_t>(s) * d_.V, d_.V, o, u_host_[s], idx, prob);
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
        const size_t n = static_cast<size_t>(cache_len_[s]) * d_.KD;
        const size_t old = static_cast<size_t>(cache_len_[w]) * d_.KD;
        for (int l = 0; l < d_.L; ++l) {
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
    DecoderInput in;
    in.rows = live;
    in.tokens = d;
    in.positions = d + live;
    in.kv_rows = d + 2 * live;
    in.cache_len = d + 3 * live;
    Step(pp, in, /*out_rows=*/nullptr, live);
  }
  RETURN_IF_ERROR(decoder_.MemoryStatus("generate"));
  res.decode_seconds = Now() - t0;
  for (const auto& g : res.sequences) res.generated_tokens += g.tokens.size();
  res.kv_cache_bytes = kv_cache_bytes();
  return res;
}

}  // namespace tandem::model
