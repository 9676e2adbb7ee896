// Megatron slicing of a model's flat parameters (tp_slice.h).
#include "worker/rollout/tp_slice.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace tandem::rollout {
namespace {

enum class Split { kReplicated, kRows, kColumns };

Split SplitOf(std::string_view name) {
  for (std::string_view s : {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                             "v_proj.bias", "gate_proj.weight", "up_proj.weight"}) {
    if (name.ends_with(s)) return Split::kRows;
  }
  if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) return Split::kColumns;
  return Split::kReplicated;
}

}  // namespace

absl::StatusOr<model::ModelConfig> TpSliceConfig(const model::ModelConfig& config, int tp_size) {
  if (tp_size < 1) return absl::InvalidArgumentError(absl::StrCat("rollout.tp_size ", tp_size, " must be >= 1"));
  const int heads = config.num_attention_heads, kv_heads = config.KvHeads(), inter = config.intermediate_size;
  auto indivisible = [&](const char* what, int n) {
    return absl::InvalidArgumentError(absl::StrCat("rollout.tp_size ", tp_size, " does not divide the model's ", what,
                                                   " (", n, "); pick a tp_size that divides ", what));
  };
  if (heads % tp_size != 0) return indivisible("num_attention_heads", heads);
  if (kv_heads % tp_size != 0) return indivisible("num_key_value_heads", kv_heads);
  if (inter % tp_size != 0) return indivisible("intermediate_size", inter);
  model::ModelConfig s = config;
  s.head_dim = config.HeadDim();
  s.num_attention_heads = heads / tp_size;
  s.num_key_value_heads = kv_heads / tp_size;
  s.intermediate_size = inter / tp_size;
  return s;
}

size_t TpSliceMap::mapped_floats() const {
  size_t n = 0;
  for (const TpRun& r : runs) n += r.count;
  return n;
}

absl::StatusOr<TpSliceMap> MakeTpSliceMap(const model::ModelConfig& config, int tp_rank, int tp_size) {
  TpSliceMap map;
  auto sc = TpSliceConfig(config, tp_size);
  if (!sc.ok()) return sc.status();
  if (tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollout: tensor-parallel rank ", tp_rank, " outside [0, ", tp_size, ")"));
  }
  map.slice_config = *sc;
  const model::ParamLayout full(config), slice(map.slice_config);
  map.full_floats = full.total_floats();
  map.slice_floats = slice.total_floats();
  for (const model::TensorView& t : slice.tensors()) {
    const model::TensorView* f = full.Find(t.name);
    TANDEM_CHECK(f != nullptr && f->shape.size() == t.shape.size());
    switch (SplitOf(t.name)) {
      case Split::kReplicated:
        TANDEM_CHECK(f->numel == t.numel);
        map.runs.push_back({f->offset, t.offset, t.numel});
        break;
      case Split::kRows:
        TANDEM_CHECK(f->numel == t.numel * static_cast<size_t>(tp_size));
        map.runs.push_back({f->offset + static_cast<size_t>(tp_rank) * t.numel, t.offset, t.numel});
        break;
      case Split::kColumns: {
        const size_t rows = static_cast<size_t>(t.shape[0]), cols = static_cast<size_t>(t.shape[1]);
        const size_t full_cols = static_cast<size_t>(f->shape[1]);
        TANDEM_CHECK(cols * static_cast<size_t>(tp_size) == full_cols);
        for (size_t r = 0; r < rows; ++r) {
          map.runs.push_back(
              {f->offset + r * full_cols + static_cast<size_t>(tp_rank) * cols, t.offset + r * cols, cols});
        }
        break;
      }
    }
  }
  return map;
}

void SliceFromFull(const TpSliceMap& map, const float* full, float* slice) {
  std::fill(slice, slice + map.slice_floats, 0.f);
  for (const TpRun& r : map.runs) std::copy(full + r.src, full + r.src + r.count, slice + r.dst);
}

}  // namespace tandem::rollout
