// Trainable parameters from glob patterns (see trainable.h).
#include "worker/model/trainable.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::model {

absl::StatusOr<std::vector<bool>> MatchTrainable(const ParamLayout& layout, const std::vector<std::string>& patterns) {
  const auto& tensors = layout.tensors();
  std::vector<bool> trainable(tensors.size(), patterns.empty());
  for (const std::string& pattern : patterns) {
    if (pattern.empty()) return absl::InvalidArgumentError("train.trainable: an empty pattern");
    bool any = false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (fnmatch(pattern.c_str(), tensors[i].name.c_str(), 0) == 0) {
        trainable[i] = true;
        any = true;
      }
    }
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat("train.trainable: pattern \"", pattern,
                                                     "\" matches no parameter of the model (names are Hugging Face "
                                                     "tensor names, e.g. \"",
                                                     tensors.empty() ? std::string() : tensors.back().name, "\")"));
    }
  }
  return trainable;
}

absl::StatusOr<std::vector<std::vector<UnitRange>>> TrainableRanges(const ParamLayout& layout,
                                                                    const std::vector<std::string>& patterns) {
  auto match = MatchTrainable(layout, patterns);
  if (!match.ok()) return match.status();
  if (std::all_of(match->begin(), match->end(), [](bool b) { return b; })) {
    return std::vector<std::vector<UnitRange>>();
  }
  std::vector<std::vector<UnitRange>> ranges(layout.num_units());
  // Tensors sorted by position (the layout lists them in unit order; sort
  // anyway so the ranges are ordered whatever the listing order).
  std::vector<size_t> order;
  for (size_t i = 0; i < match->size(); ++i) {
    if ((*match)[i]) order.push_back(i);
  }
  const auto& tensors = layout.tensors();
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (size_t i : order) {
    const TensorView& t = tensors[i];
    auto& unit = ranges[t.unit];
    if (!unit.empty() && unit.back().offset + unit.back().size == t.offset_in_unit) {
      unit.back().size += t.numel;
    } else {
      unit.push_back({t.offset_in_unit, t.numel});
    }
  }
  return ranges;
}

absl::StatusOr<size_t> TrainableCount(const ParamLayout& layout, const std::vector<std::string>& patterns) {
  auto match = MatchTrainable(layout, patterns);
  if (!match.ok()) return match.status();
  size_t n = 0;
  for (size_t i = 0; i < match->size(); ++i) {
    if ((*match)[i]) n += layout.tensors()[i].numel;
  }
  return n;
}

}  // namespace tandem::model
