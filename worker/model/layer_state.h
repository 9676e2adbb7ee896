// LayerState: the per-layer decode state of a model for a fixed number of
// sequence slots, sized by each layer's type (layer_types.h):
//
//   full               KV cache of `capacity` rows per slot
//   window:N           a ring of N rows per slot (position p at row p % N)
//   sink:S+window:N    S sink rows (positions 0..S-1) + a ring of N rows
//   linear             the recurrent state [H, D, D] per slot, no KV at all
//
// One Step(layer, ...) appends one new token per slot (its k and v, after
// RoPE) and computes its attention output: softmax layers attend over the
// rows they keep (decode_attention over min(p + 1, rows) rows: the keys
// carry their positions through RoPE, so the ring order does not matter),
// linear layers advance their state in place (linear_attention_forward with
// the state as initial and final state). The outputs equal the training
// kernels' rows at the same positions (tests/model/model_layer_state_test.cc).
// KV bytes per slot are bounded for every type but `full`.
//
// Device pointers of `memory`; Step allocates nothing. One thread at a time.
// Errors: Create returns ResourceExhausted when the state cannot be
// allocated, InvalidArgument for bad sizes; Step's positions must advance by
// one per slot from 0 (checked, InvalidArgument otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/layer_types.h"

namespace tandem::model {

class LayerState {
 public:
  // `capacity`: the longest sequence (positions) a slot will hold; full
  // layers keep that many rows, bounded layers min(capacity, their bound).
  static absl::StatusOr<std::unique_ptr<LayerState>> Create(const ModelConfig& config, kernels::Ops* ops,
                                                            kernels::DeviceMemory* memory, int slots, int capacity);

  // Bytes of decode state one sequence of `tokens` tokens needs in `layer`
  // (k and v rows for softmax layers, the [H, D, D] state for linear ones).
  static int64_t LayerBytes(const ModelConfig& config, int layer, int64_t tokens);
  // Sum over the layers: the KV (and state) bytes of one sequence.
  static int64_t SequenceBytes(const ModelConfig& config, int64_t tokens);

  // Rows of layer l per slot (0 for linear layers).
  int rows(int layer) const { return rows_[layer]; }
  // Device bytes held (all layers, all slots).
  size_t bytes() const;

  // Empties slot b (its next token is position 0).
  void Reset(int slot);

  // One token for each of the first positions.size() slots, at positions
  // [b] (= the slot's length so far). q [n, H*D], k, v [n, Hkv*D] (after
  // RoPE), out [n, H*D]; device pointers.
  absl::Status Step(int layer, std::span<const int32_t> positions, const float* q, const float* k, const float* v,
                    float* out);

 private:
  LayerState() = default;
  int RowOf(int layer, int pos) const;

  ModelConfig config_;
  kernels::Ops* ops_ = nullptr;
  kernels::DeviceMemory* mem_ = nullptr;
  int slots_ = 0, capacity_ = 0, H_ = 0, Hkv_ = 0, D_ = 0;
  std::vector<LayerType> types_;
  std::vector<int> rows_;
  // Per layer: k and v [slots, rows, Hkv, D] (softmax) or the state
  // [slots, H, D, D] (linear, in k_).
  std::vector<kernels::DeviceArray<float>> k_, v_;
  std::vector<int32_t> length_;              // tokens per slot so far
  std::vector<int32_t> host_idx_;            // staging for the index arrays
  kernels::DeviceArray<int32_t> cache_len_;  // [slots]
  kernels::DeviceArray<int32_t> cu_;         // [slots + 1] = 0, 1, ..., slots
  kernels::DeviceArray<float> decay_;        // [slots, H] log decay
};

}  // namespace tandem::model
