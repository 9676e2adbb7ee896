// Context embeddings from a file (`tandemctl generate --context-embeddings`):
// a safetensors file holding exactly one tensor of shape [n, hidden_size],
// F32 or BF16, n >= 1, every value finite. Returns the rows as fp32, row
// major. Every problem is an InvalidArgument (NotFound for a missing file)
// naming the file and what is wrong. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::model {

// Files with more rows are refused before any allocation.
inline constexpr int64_t kMaxContextRows = int64_t{1} << 22;

absl::StatusOr<std::vector<float>> LoadContextEmbeddings(const std::string& path, int hidden_size);

}  // namespace tandem::model
