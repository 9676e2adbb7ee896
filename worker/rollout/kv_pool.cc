#include "worker/rollout/kv_pool.h"

#include "absl/strings/str_cat.h"

namespace tandem::rollout {

size_t KvPool::BlockBytes(int kv_layers, int kv_dim, int block_size, kernels::KvDtype dtype, bool summaries) {
  const size_t elem = dtype == kernels::KvDtype::kBF16 ? 2 : 4;
  const size_t summary = summaries ? 2 * static_cast<size_t>(kv_dim) * sizeof(float) : 0;
  return static_cast<size_t>(kv_layers) * (2 * static_cast<size_t>(block_size) * kv_dim * elem + summary);
}

absl::Status KvPool::Allocate(kernels::DeviceMemory* mem, int layers, int kv_dim, int block_size, int num_blocks,
                              kernels::KvDtype dtype, bool summaries, const std::vector<bool>& has_kv,
                              const std::vector<bool>& windowed, int windowed_blocks) {
  Release();
  mem_ = mem;
  dtype_ = dtype;
  kv_dim_ = kv_dim;
  block_size_ = block_size;
  windowed_ = windowed;
  auto kv_at = [&](int l) { return has_kv.empty() || has_kv[l]; };
  bool ok = true;
  const bool bf16 = dtype == kernels::KvDtype::kBF16;
  if (bf16) {
    kh_.resize(layers);
    vh_.resize(layers);
  } else {
    kf_.resize(layers);
    vf_.resize(layers);
  }
  if (summaries) sum_.resize(layers);
  size_t want = 0;
  for (int l = 0; l < layers && ok; ++l) {
    if (!kv_at(l)) continue;
    const bool in_pool1 = pool(l) == 1;
    const int blocks = in_pool1 ? windowed_blocks : num_blocks;
    const size_t n = static_cast<size_t>(blocks) * block_size * kv_dim;
    want += BlockBytes(1, kv_dim, block_size, dtype, summaries && !in_pool1) * blocks;
    ok = bf16 ? kh_[l].Allocate(mem, n) && vh_[l].Allocate(mem, n) : kf_[l].Allocate(mem, n) && vf_[l].Allocate(mem, n);
    if (ok && summaries && !in_pool1) ok = sum_[l].Allocate(mem, static_cast<size_t>(blocks) * 2 * kv_dim);
  }
  if (!ok) {
    Release();
    return absl::ResourceExhaustedError(
        absl::StrCat("rollout: cannot allocate a KV cache of ", want, " bytes in ", mem->name(),
                     " memory; lower rollout.kv_cache_bytes or rollout.kv_cache_fraction"));
  }
  num_blocks_ = num_blocks;
  windowed_blocks_ = windowed_blocks;
  return absl::OkStatus();
}

absl::Status KvPool::AllocateStates(const std::vector<bool>& has_state, size_t state_floats, int slots) {
  states_.clear();
  state_floats_ = 0;
  state_slots_ = 0;
  if (slots <= 0) return absl::OkStatus();
  states_.resize(has_state.size());
  for (size_t l = 0; l < has_state.size(); ++l) {
    if (has_state[l] && !states_[l].Allocate(mem_, state_floats * static_cast<size_t>(slots))) {
      states_.clear();
      return absl::ResourceExhaustedError(
          absl::StrCat("rollout: cannot allocate ", slots, " linear-attention states of ", state_floats * sizeof(float),
                       " bytes per layer in ", mem_->name(), " memory; lower rollout.max_seqs"));
    }
  }
  state_floats_ = state_floats;
  state_slots_ = slots;
  return absl::OkStatus();
}

void KvPool::Release() {
  kf_.clear();
  vf_.clear();
  kh_.clear();
  vh_.clear();
  sum_.clear();
  states_.clear();
  state_floats_ = 0;
  state_slots_ = 0;
  num_blocks_ = 0;
  windowed_blocks_ = 0;
  windowed_.clear();
}

size_t KvPool::bytes() const {
  size_t n = 0;
  for (const auto& a : kf_) n += a.bytes();
  for (const auto& a : vf_) n += a.bytes();
  for (const auto& a : kh_) n += a.bytes();
  for (const auto& a : vh_) n += a.bytes();
  for (const auto& a : sum_) n += a.bytes();
  return n + state_bytes();
}

size_t KvPool::state_bytes() const {
  size_t n = 0;
  for (const auto& a : states_) n += a.bytes();
  return n;
}

float* KvPool::States(int l) const {
  return static_cast<size_t>(l) < states_.size() && !states_[l].empty() ? const_cast<float*>(states_[l].data())
                                                                        : nullptr;
}

void KvPool::CopyState(int src, int dst) {
  const size_t bytes = state_floats_ * sizeof(float);
  for (auto& s : states_) {
    if (!s.empty()) mem_->CopyOnDevice(s.data() + dst * state_floats_, s.data() + src * state_floats_, bytes);
  }
}

void* KvPool::K(int l) const {
  return dtype_ == kernels::KvDtype::kBF16 ? static_cast<void*>(const_cast<uint16_t*>(kh_[l].data()))
                                           : static_cast<void*>(const_cast<float*>(kf_[l].data()));
}
void* KvPool::V(int l) const {
  return dtype_ == kernels::KvDtype::kBF16 ? static_cast<void*>(const_cast<uint16_t*>(vh_[l].data()))
                                           : static_cast<void*>(const_cast<float*>(vf_[l].data()));
}

float* KvPool::Summaries(int l) const {
  return sum_.empty() || sum_[l].empty() ? nullptr : const_cast<float*>(sum_[l].data());
}

kernels::PagedKv KvPool::Layer(int l, const int32_t* block_tables, int max_blocks) const {
  kernels::PagedKv kv;
  kv.k = K(l);
  kv.v = V(l);
  kv.dtype = dtype_;
  kv.block_size = block_size_;
  kv.num_blocks = pool(l) == 1 ? windowed_blocks_ : num_blocks_;
  kv.block_tables = block_tables;
  kv.max_blocks = max_blocks;
  return kv;
}

void KvPool::CopyBlock(int pool_id, int32_t src, int32_t dst) {
  const size_t elem = dtype_ == kernels::KvDtype::kBF16 ? 2 : 4;
  const size_t bytes = static_cast<size_t>(block_size_) * kv_dim_ * elem;
  const size_t sum_floats = 2 * static_cast<size_t>(kv_dim_);
  const int layers = static_cast<int>(dtype_ == kernels::KvDtype::kBF16 ? kh_.size() : kf_.size());
  for (int l = 0; l < layers; ++l) {
    if (pool(l) != pool_id) continue;
    for (void* base : {K(l), V(l)}) {
      char* b = static_cast<char*>(base);
      if (b != nullptr) mem_->CopyOnDevice(b + dst * bytes, b + src * bytes, bytes);
    }
    if (float* s = Summaries(l); s != nullptr) {
      mem_->CopyOnDevice(s + dst * sum_floats, s + src * sum_floats, sum_floats * sizeof(float));
    }
  }
}

}  // namespace tandem::rollout
