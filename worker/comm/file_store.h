// FileStore: a Store in a directory shared by the processes of one machine
// (local multi-process runs and tests without a coordinator). One file per
// key (name = hex of the key), written to a temporary name and renamed, so
// readers never see partial values; Add holds an flock(2) on "<dir>/.lock".
// Get/Wait poll every millisecond (growing to 10 ms) until the timeout.
//
// Thread- and process-safe.
#pragma once

#include <string>

#include "worker/comm/store.h"

namespace tandem::comm {

class FileStore final : public Store {
 public:
  // Creates `dir` if needed.
  explicit FileStore(std::string dir);

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

 private:
  std::string Path(std::string_view key) const;
  const std::string dir_;
};

}  // namespace tandem::comm
