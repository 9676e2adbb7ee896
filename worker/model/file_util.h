// Small file helpers for model files: whole-file read, atomic write (temp
// file in the same directory, fsync, rename, fsync of the directory).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

// NotFound when the file does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes `data` to `path` atomically: readers see the old file or the whole
// new one, never a partial file.
absl::Status WriteFileAtomic(const std::string& path, std::string_view data);
// Same, with the contents produced in pieces (header + raw tensor bytes).
absl::Status WriteFileAtomicParts(const std::string& path, const std::vector<std::string_view>& parts);
// Same, with the contents produced by `produce`, which calls `write` with
// each piece in order (so a large file needs no copy of itself in memory).
// An error from `produce` or `write` leaves the old file and no temp file.
using AtomicWriteFn = std::function<absl::Status(std::string_view)>;
absl::Status WriteFileAtomicStream(const std::string& path,
                                   const std::function<absl::Status(const AtomicWriteFn& write)>& produce);

}  // namespace tandem::model
