#include "worker/model/activation_checkpointing.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::model {

absl::StatusOr<ActivationCheckpointing> ParseActivationCheckpointing(std::string_view name) {
  if (name.empty() || name == "none") return ActivationCheckpointing::kNone;
  if (name == "selective") return ActivationCheckpointing::kSelective;
  if (name == "layer") return ActivationCheckpointing::kLayer;
  return absl::InvalidArgumentError(
      absl::StrCat("train.activation_checkpointing \"", std::string(name), "\" (expected none, selective or layer)"));
}

const char* ActivationCheckpointingName(ActivationCheckpointing mode) {
  switch (mode) {
    case ActivationCheckpointing::kNone:
      return "none";
    case ActivationCheckpointing::kSelective:
      return "selective";
    case ActivationCheckpointing::kLayer:
      return "layer";
  }
  return "none";
}

}  // namespace tandem::model
