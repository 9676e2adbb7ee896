#include "worker/model/layer_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::model {

int64_t LayerState::LayerBytes(const ModelConfig& c, int layer, int64_t tokens) {
  const LayerType t = LayerTypeOf(c, layer);
  const int64_t d = c.HeadDim();
  if (t.kind == LayerKind::kLinear) {
    return int64_t{c.num_attention_heads} * d * d * int64_t{sizeof(float)};
  }
  const int64_t bound = t.BoundedKeys();
  const int64_t rows = bound > 0 ? std::min(tokens, bound) : tokens;
  return 2 * rows * c.KvHeads() * d * int64_t{sizeof(float)};
}

int64_t LayerState::SequenceBytes(const ModelConfig& c, int64_t tokens) {
  int64_t total = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) total += LayerBytes(c, l, tokens);
  return total;
}

absl::StatusOr<std::unique_ptr<LayerState>> LayerState::Create(const ModelConfig& config, kernels::Ops* ops,
                                                               kernels::DeviceMemory* memory, int slots, int capacity) {
  if (slots <= 0 || capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer state: slots (", slots, ") and capacity (", capacity, ") must be positive"));
  }
  std::unique_ptr<LayerState> s(new LayerState());
  s->config_ = config;
  s->ops_ = ops;
  s->mem_ = memory;
  s->slots_ = slots;
  s->capacity_ = capacity;
  s->H_ = config.num_attention_heads;
  s->Hkv_ = config.KvHeads();
  s->D_ = config.HeadDim();
  const int L = config.num_hidden_layers;
  s->k_.resize(L);
  s->v_.resize(L);
  auto oom = [&](size_t floats) {
    return absl::ResourceExhaustedError(
        absl::StrCat("layer state: cannot allocate ", floats * sizeof(float), " bytes in ", memory->name(), " memory"));
  };
  for (int l = 0; l < L; ++l) {
    const LayerType t = LayerTypeOf(config, l);
    s->types_.push_back(t);
    if (t.kind == LayerKind::kLinear) {
      s->rows_.push_back(0);
      const size_t n = size_t(slots) * s->H_ * s->D_ * s->D_;
      if (!s->k_[l].AllocateZeroed(memory, n)) return oom(n);
      continue;
    }
    const int bound = t.BoundedKeys();
    const int rows = bound > 0 ? std::min(capacity, bound) : capacity;
    s->rows_.push_back(rows);
    const size_t n = size_t(slots) * rows * s->Hkv_ * s->D_;
    if (!s->k_[l].AllocateZeroed(memory, n) || !s->v_[l].AllocateZeroed(memory, n)) {
      return oom(2 * n);
    }
  }
  s->length_.assign(slots, 0);
  if (!s->cache_len_.Allocate(memory, slots) || !s->cu_.Allocate(memory, slots + 1) ||
      !s->decay_.Allocate(memory, size_t(slots) * s->H_)) {
    return oom(size_t(slots) * (s->H_ + 2) + 1);
  }
  std::vector<int32_t> cu(slots + 1);
  for (int i = 0; i <= slots; ++i) cu[i] = i;
  s->cu_.Upload(cu.data(), cu.size());
  std::vector<float> decay(size_t(slots) * s->H_);
  for (size_t i = 0; i < decay.size(); ++i) {
    decay[i] = static_cast<float>(LinearLogDecay(static_cast<int>(i % s->H_)));
  }
  s->decay_.Upload(decay.data(), decay.size());
  s->host_idx_.resize(slots);
  return s;
}

size_t LayerState::bytes() const {
  size_t total = 0;
  for (size_t l = 0; l < k_.size(); ++l) total += k_[l].bytes() + v_[l].bytes();
  return total;
}

void LayerState::Reset(int slot) {
  length_[slot] = 0;
  for (size_t l = 0; l < types_.size(); ++l) {
    if (types_[l].kind != LayerKind::kLinear) continue;  // stale rows are never read
    const size_t n = size_t(H_) * D_ * D_;
    mem_->SetZero(k_[l].data() + size_t(slot) * n, n * sizeof(float));
  }
}

int LayerState::RowOf(int layer, int pos) const {
  const LayerType& t = types_[layer];
  switch (t.kind) {
    case LayerKind::kWindow:
      return pos % t.window;
    case LayerKind::kSinkWindow:
      return pos < t.sinks ? pos : t.sinks + (pos - t.sinks) % t.window;
    default:
      return pos;
  }
}

absl::Status LayerState::Step(int layer, std::span<const int32_t> positions, const float* q, const float* k,
                              const float* v, float* out) {
  const int n = static_cast<int>(positions.size());
  if (layer < 0 || layer >= static_cast<int>(types_.size()) || n > slots_) {
    return absl::InvalidArgumentError(absl::StrCat("layer state: layer ", layer, " or ", n, " slots out of range"));
  }
  const bool last_layer = layer + 1 == static_cast<int>(types_.size());
  for (int b = 0; b < n; ++b) {
    if (positions[b] != length_[b] || positions[b] >= capacity_) {
      return absl::InvalidArgumentError(absl::StrCat("layer state: slot ", b, " is at position ", length_[b],
                                                     " (capacity ", capacity_, "), got a token at ", positions[b]));
    }
  }
  const LayerType& t = types_[layer];
  if (t.kind == LayerKind::kLinear) {
    kernels::LinearAttentionParams p;
    p.num_heads = H_;
    p.key_dim = D_;
    p.value_dim = D_;
    ops_->linear_attention_forward(p, q, k, v, decay_.data(), cu_.data(), n, n, k_[layer].data(), out,
                                   k_[layer].data());
  } else {
    const size_t kd = size_t(Hkv_) * D_, rows = rows_[layer];
    for (int b = 0; b < n; ++b) {
      const size_t row = size_t(b) * rows + RowOf(layer, positions[b]);
      mem_->CopyOnDevice(k_[layer].data() + row * kd, k + b * kd, kd * sizeof(float));
      mem_->CopyOnDevice(v_[layer].data() + row * kd, v + b * kd, kd * sizeof(float));
      host_idx_[b] = std::min<int32_t>(positions[b] + 1, static_cast<int32_t>(rows));
    }
    cache_len_.Upload(host_idx_.data(), n);
    kernels::AttentionParams p;
    p.num_heads = H_;
    p.num_kv_heads = Hkv_;
    p.head_dim = D_;
    p.window = -1;  // every kept row is visible
    ops_->decode_attention(p, q, n, 1, k_[layer].data(), v_[layer].data(), static_cast<int>(rows), cache_len_.data(),
                           out);
  }
  if (last_layer) {
    for (int b = 0; b < n; ++b) ++length_[b];
  }
  if (!mem_->ok()) {
    return absl::InternalError(absl::StrCat("layer state: device memory: ", mem_->last_error()));
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
