// Context embeddings from a safetensors file (see context_embeddings.h).
#include "worker/model/context_embeddings.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/model/safetensors.h"

namespace tandem::model {

absl::StatusOr<std::vector<float>> LoadContextEmbeddings(const std::string& path, int hidden_size) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("context embeddings ", path, ": ", what));
  };
  if (file->tensors().size() != 1) {
    return bad(absl::StrCat("holds ", file->tensors().size(), " tensors; expected exactly one, [n, hidden_size]"));
  }
  const StTensorInfo& t = file->tensors().begin()->second;
  if (t.dtype != StDtype::kF32 && t.dtype != StDtype::kBF16) {
    return bad(absl::StrCat("tensor \"", t.name, "\" is ", StDtypeName(t.dtype), "; expected F32 or BF16"));
  }
  if (t.shape.size() != 2) {
    return bad(
        absl::StrCat("tensor \"", t.name, "\" has ", t.shape.size(), " dimensions; expected [n, ", hidden_size, "]"));
  }
  if (t.shape[1] != hidden_size) {
    return bad(absl::StrCat("tensor \"", t.name, "\" is [", t.shape[0], ", ", t.shape[1],
                            "]; the model's hidden size is ", hidden_size));
  }
  if (t.shape[0] < 1 || t.shape[0] > kMaxContextRows) {
    return bad(absl::StrCat("tensor \"", t.name, "\" has ", t.shape[0], " rows; expected 1 to ", kMaxContextRows));
  }
  const size_t numel = static_cast<size_t>(t.shape[0]) * static_cast<size_t>(hidden_size);
  std::vector<float> out(numel);
  if (absl::Status st = file->ReadF32(t.name, out.data(), numel); !st.ok()) return st;
  for (size_t k = 0; k < numel; ++k) {
    if (!std::isfinite(out[k])) {
      return bad(
          absl::StrCat("row ", k / hidden_size, ", column ", k % hidden_size, " is ", out[k], " (must be finite)"));
    }
  }
  return out;
}

}  // namespace tandem::model
