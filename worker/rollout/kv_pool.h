// KvPool: the device memory of a paged KV cache, one k and one v pool per
// softmax-attention layer, each [num_blocks, block_size, Hkv, D] in fp32 or
// bf16 (kernels/ops.h, PagedKv), and for sparse attention the key summaries
// of every block ([num_blocks, Hkv, 2, D] fp32 per layer,
// Ops::paged_key_summaries). Windowed layers beside full ones may form a
// second pool (pool 1) of their own block count, numbered apart from the
// first (pool 0): the scheduler gives each sequence a block table per pool. Layers without a KV cache (linear
// attention) hold instead one recurrent state per running sequence: `slots` states of `state_floats` fp32 each ([H, Dk,
// Dv]) per such layer. Allocated once per rollout from a byte budget and freed with the pool: nothing stays between
// rollout phases. Move-only; one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace tandem::rollout {

class KvPool {
 public:
  KvPool() = default;
  KvPool(KvPool&&) = default;
  KvPool& operator=(KvPool&&) = default;

  // Bytes of one block over `kv_layers` layers with a KV cache (k and v,
  // and its key summaries).
  static size_t BlockBytes(int kv_layers, int kv_dim, int block_size, kernels::KvDtype dtype, bool summaries = false);

  // Allocates num_blocks blocks per layer (with key summaries when asked);
  // `has_kv[l]` false leaves layer l without a cache (empty = every layer
  // has one). Layers with `windowed[l]` form pool 1 of `windowed_blocks`
  // blocks (no summaries). ResourceExhausted when the memory cannot hold
  // them.
  absl::Status Allocate(kernels::DeviceMemory* mem, int layers, int kv_dim, int block_size, int num_blocks,
                        kernels::KvDtype dtype, bool summaries = false, const std::vector<bool>& has_kv = {},
                        const std::vector<bool>& windowed = {}, int windowed_blocks = 0);
  // Allocates `slots` recurrent states of `state_floats` floats for every
  // layer l with has_state[l] (replacing earlier ones; 0 slots frees them).
  absl::Status AllocateStates(const std::vector<bool>& has_state, size_t state_floats, int slots);
  void Release();

  int num_blocks() const { return num_blocks_; }
  int windowed_blocks() const { return windowed_blocks_; }
  const std::vector<bool>& windowed_layers() const { return windowed_; }
  // Layer l's pool: 1 for a windowed layer of a two-pool cache, else 0.
  int pool(int l) const { return static_cast<size_t>(l) < windowed_.size() && windowed_[l] ? 1 : 0; }
  int block_size() const { return block_size_; }
  kernels::KvDtype dtype() const { return dtype_; }
  bool has_summaries() const { return !sum_.empty(); }
  int state_slots() const { return state_slots_; }
  size_t state_floats() const { return state_floats_; }
  // Every byte held (KV blocks, summaries, states) and the states' part.
  size_t bytes() const;
  size_t state_bytes() const;

  // Layer l's k and v pools with the given (device) block tables of its
  // pool.
  kernels::PagedKv Layer(int l, const int32_t* block_tables, int max_blocks) const;
  // Layer l's key summaries [num_blocks, Hkv, 2, D] (nullptr without).
  float* Summaries(int l) const;
  // Copies block src to dst of pool `pool` in each of its layers
  // (copy-on-write), with its summaries.
  void CopyBlock(int pool, int32_t src, int32_t dst);
  // Layer l's states [slots, state_floats] (nullptr for a layer without).
  float* States(int l) const;
  // Copies state slot src to dst in every layer that has states.
  void CopyState(int src, int dst);

 private:
  void* K(int l) const;
  void* V(int l) const;

  kernels::DeviceMemory* mem_ = nullptr;
  kernels::KvDtype dtype_ = kernels::KvDtype::kF32;
  int kv_dim_ = 0, block_size_ = 0, num_blocks_ = 0, windowed_blocks_ = 0;
  std::vector<bool> windowed_;  // per layer: in pool 1
  std::vector<kernels::DeviceArray<float>> kf_, vf_;
  std::vector<kernels::DeviceArray<uint16_t>> kh_, vh_;
  std::vector<kernels::DeviceArray<float>> sum_;
  std::vector<kernels::DeviceArray<float>> states_;  // per layer; empty without
  size_t state_floats_ = 0;
  int state_slots_ = 0;
};

}  // namespace tandem::rollout
