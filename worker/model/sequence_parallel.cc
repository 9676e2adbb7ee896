#include "worker/model/sequence_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<Batch> SliceBatch(const Batch& global, int rank, int size) {
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
  const std::vector<int> bounds = SliceBounds(T, size);
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
  b.slice = std::move(s);
  return b;
}

}  // namespace tandem::model
