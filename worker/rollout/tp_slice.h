// Tensor-parallel slices of a model (Megatron layout) for rollout: rank t of
// a TP group of T holds query heads [t*H/T, (t+1)*H/T), key/value heads
// [t*Hkv/T, (t+1)*Hkv/T), the matching rows of Wq/Wk/Wv (and their biases),
// the matching columns of Wo, MLP columns [t*I/T, (t+1)*I/T) (rows of
// Wgate/Wup, columns of Wdown); embeddings, norms and the LM head are
// replicated. The slice is itself a model: TpSliceConfig is a ModelConfig
// with H/T, Hkv/T and I/T (head_dim kept), so a slice lives in that config's
// flat ParamLayout and a Decoder runs it; the attention-out and MLP-down
// products of the ranks then sum to the full model's (tp_decoder.h).
//
// TpSliceMap lists where every float of a slice comes from in the full flat
// layout, as contiguous runs (one per replicated or row-split tensor, one
// per row of a column-split one), in increasing order of both offsets.
// Pure functions, no device memory; any thread.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"

namespace tandem::rollout {

// The config of one rank's slice. InvalidArgument naming the size when
// tp_size < 1, or the heads, the key/value heads or intermediate_size do
// not divide by tp_size. Linear-attention layers split by heads like
// softmax ones (TpDecoder gives the slice's decoder its first head).
absl::StatusOr<model::ModelConfig> TpSliceConfig(const model::ModelConfig& config, int tp_size);

// A run of `count` floats: full[src..) -> slice[dst..).
struct TpRun {
  size_t src = 0;
  size_t dst = 0;
  size_t count = 0;
};

struct TpSliceMap {
  model::ModelConfig slice_config;
  size_t slice_floats = 0;  // ParamLayout(slice_config).total_floats()
  size_t full_floats = 0;
  std::vector<TpRun> runs;  // sorted by src (and by dst)
  size_t mapped_floats() const;
};

// The map of rank tp_rank of tp_size (errors as TpSliceConfig, and for a
// tp_rank outside [0, tp_size)).
absl::StatusOr<TpSliceMap> MakeTpSliceMap(const model::ModelConfig& config, int tp_rank, int tp_size);

// slice[map.slice_floats] = the rank's slice of full[map.full_floats]
// (padding zero). Host pointers.
void SliceFromFull(const TpSliceMap& map, const float* full, float* slice);

}  // namespace tandem::rollout
