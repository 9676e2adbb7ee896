#include "worker/model/sequence_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/model/config.h"
#include "worker/model/decoder.h"
#include "worker/model/model.h"

namespace tandem::model {

namespace {

// Index of the global sequence holding global row g.
int SequenceOf(const std::vector<int32_t>& cu, int g) {
  return static_cast<int>(std::upper_bound(cu.begin(), cu.end(), g) - cu.begin()) - 1;
}

}  // namespace

bool SequenceSlice::continues_in() const {
  if (rows <= 0 || offset == 0) return false;
  return global_cu[SequenceOf(global_cu, offset)] < offset;
}

bool SequenceSlice::continues_out() const {
  if (rows <= 0) return false;
  const int last = offset + rows - 1;
  return global_cu[SequenceOf(global_cu, last) + 1] > last + 1;
}

std::vector<int> SliceBounds(int rows, int size) {
  std::vector<int> bounds(size + 1, 0);
  for (int r = 0; r < size; ++r) bounds[r + 1] = bounds[r] + rows / size + (r < rows % size ? 1 : 0);
  return bounds;
}

double SliceCost::Row(int pos) const {
  double keys = 0;
  for (const LayerType& t : softmax) {
    const int bound = t.BoundedKeys();
    keys += bound > 0 ? std::min(pos + 1, bound) : pos + 1;
  }
  return per_row + per_key * keys;
}

SliceCost SliceCostOf(const ModelConfig& config) {
  const DecoderDims d(config);
  SliceCost c;
  // Forward flops (the backward is about twice both parts, so the ratio
  // holds): 2 m n k per product.
  const double C = d.C, HD = d.HD, KD = d.KD, I = d.I, V = d.V;
  c.per_row = 2.0 * V * C;  // LM head
  for (int l = 0; l < d.L; ++l) {
    c.per_row += 2.0 * C * (2 * HD + 2 * KD) + 2.0 * 3 * C * I;
    const LayerType t = LayerTypeOf(config, l);
    if (t.softmax()) {
      c.softmax.push_back(t);
    } else {
      c.per_row += 4.0 * HD * d.D;  // the state's update and read-out per row
    }
  }
  c.per_key = 4.0 * HD;  // QK^T and PV
  return c;
}

std::vector<int> BalancedSliceBounds(const std::vector<int32_t>& cu, int size, const SliceCost& cost) {
  const int rows = cu.empty() ? 0 : cu.back();
  if (cost.per_key <= 0 || cost.softmax.empty() || size <= 1 || rows < size) return SliceBounds(rows, size);
  std::vector<double> prefix(static_cast<size_t>(rows) + 1, 0.0);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    for (int g = cu[b]; g < cu[b + 1]; ++g) prefix[g + 1] = prefix[g] + cost.Row(g - cu[b]);
  }
  std::vector<int> bounds(size + 1, rows);
  bounds[0] = 0;
  for (int r = 1; r < size; ++r) {
    const double target = prefix[rows] * r / size;
    int at = static_cast<int>(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
    // Between the rows just below and at the target, the nearer; at least
    // one row per rank on each side.
    if (at > 0 && target - prefix[at - 1] < prefix[at] - target) --at;
    bounds[r] = std::clamp(at, bounds[r - 1] + 1, rows - (size - r));
  }
  return bounds;
}

absl::StatusOr<Batch> SliceBatch(const Batch& global, int rank, int size, const SliceCost& cost) {
  const int T = global.num_tokens();
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("sequence parallel: bad rank ", rank, " of ", size));
  }
  if (T < size) {
    return absl::InvalidArgumentError(absl::StrCat("sequence parallel: a batch of ", T, " tokens cannot be split over ",
                                                   size, " ranks (at least one token per rank)"));
  }
  if (global.cu_seqlens.size() < 2 || global.cu_seqlens.front() != 0 || global.cu_seqlens.back() != T ||
      global.targets.size() != static_cast<size_t>(T) || global.positions.size() != static_cast<size_t>(T)) {
    return absl::InvalidArgumentError("sequence parallel: malformed batch (sizes or cu_seqlens)");
  }
  const std::vector<int> bounds = BalancedSliceBounds(global.cu_seqlens, size, cost);
  const int lo = bounds[rank], hi = bounds[rank + 1];
  Batch b;
  b.tokens.assign(global.tokens.begin() + lo, global.tokens.begin() + hi);
  b.targets.assign(global.targets.begin() + lo, global.targets.begin() + hi);
  b.positions.assign(global.positions.begin() + lo, global.positions.begin() + hi);
  b.cu_seqlens.push_back(0);
  for (size_t i = 1; i < global.cu_seqlens.size(); ++i) {
    const int end = std::clamp(global.cu_seqlens[i], lo, hi) - lo;
    if (end > b.cu_seqlens.back()) b.cu_seqlens.push_back(end);
  }
  SequenceSlice s;
  s.rank = rank;
  s.size = size;
  s.offset = lo;
  s.rows = hi - lo;
  s.global_cu = global.cu_seqlens;
  s.bounds = bounds;
  b.slice = std::move(s);
  return b;
}

}  // namespace tandem::model
