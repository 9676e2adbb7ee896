// Trainable parameters (the job key train.trainable): glob patterns over the
// model's Hugging Face tensor names (fnmatch syntax: `*`, `?`, `[...]`; `*`
// also matches dots), turned into the per-unit element ranges the ZeRO
// optimizer keeps gradients and moments for. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/param_layout.h"

namespace tandem::model {

// Elements [offset, offset + size) of one unit (offsets within the unit).
struct UnitRange {
  size_t offset = 0;
  size_t size = 0;
};

// Per tensor of layout.tensors(): whether any pattern matches its name.
// Empty `patterns`: everything. InvalidArgument naming the pattern when a
// pattern is empty or matches no tensor.
absl::StatusOr<std::vector<bool>> MatchTrainable(const ParamLayout& layout, const std::vector<std::string>& patterns);

// Per unit, the trainable ranges (sorted, disjoint; adjacent tensors
// merged). Empty result: everything is trainable (no patterns, or patterns
// that match every tensor). Errors as MatchTrainable.
absl::StatusOr<std::vector<std::vector<UnitRange>>> TrainableRanges(const ParamLayout& layout,
                                                                    const std::vector<std::string>& patterns);

// Elements of the tensors the patterns match (all of them without patterns).
absl::StatusOr<size_t> TrainableCount(const ParamLayout& layout, const std::vector<std::string>& patterns);

}  // namespace tandem::model
