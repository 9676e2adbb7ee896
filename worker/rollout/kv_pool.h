// KvPool: the device memory of a paged KV cache, one k and one v pool per
// layer, each [num_blocks, block_size, Hkv, D] in fp32 or bf16
// (kernels/ops.h, PagedKv), and for sparse attention the key summaries of
// every block ([num_blocks, Hkv, 2, D] fp32 per layer,
// Ops::paged_key_summaries). Allocated once per rollout from a byte budget
// and freed with the pool: nothing stays between rollout phases. Move-only;
// one thread at a time.
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

  // Bytes of one block over all layers (k and v, and its key summaries).
  static size_t BlockBytes(int layers, int kv_dim, int block_size, kernels::KvDtype dtype, bool summaries = false);

  // Allocates num_blocks blocks per layer (with key summaries when asked).
  // ResourceExhausted when the memory cannot hold them.
  absl::Status Allocate(kernels::DeviceMemory* mem, int layers, int kv_dim, int block_size, int num_blocks,
                        kernels::KvDtype dtype, bool summaries = false);
  void Release();

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  kernels::KvDtype dtype() const { return dtype_; }
  bool has_summaries() const { return !sum_.empty(); }
  size_t bytes() const;

  // Layer l's pools with the given (device) block tables.
  kernels::PagedKv Layer(int l, const int32_t* block_tables, int max_blocks) const;
  // Layer l's key summaries [num_blocks, Hkv, 2, D] (nullptr without).
  float* Summaries(int l) const;
  // Copies block src to dst in every layer (copy-on-write), with its
  // summaries.
  void CopyBlock(int32_t src, int32_t dst);

 private:
  void* K(int l) const;
  void* V(int l) const;

  kernels::DeviceMemory* mem_ = nullptr;
  kernels::KvDtype dtype_ = kernels::KvDtype::kF32;
  int kv_dim_ = 0, block_size_ = 0, num_blocks_ = 0;
  std::vector<kernels::DeviceArray<float>> kf_, vf_;
  std::vector<kernels::DeviceArray<uint16_t>> kh_, vh_;
  std::vector<kernels::DeviceArray<float>> sum_;
};

}  // namespace tandem::rollout
