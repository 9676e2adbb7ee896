// TensorBoard event files: TFRecord framing (little-endian uint64 length,
// masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the data)
// around hand-encoded tensorflow.Event protos. The first record is
// Event{wall_time, file_version: "brain.Event:2"}; each scalar write is
// Event{wall_time, step, summary{value{tag, simple_value}}}.
// Field numbers follow TensorFlow's event.proto and summary.proto: Event
// wall_time=1 (double), step=2 (int64), file_version=3, summary=5;
// Summary value=1; Summary.Value tag=1, simple_value=2 (float).
//
// TfEventsWriter owns its file (closed by the destructor), flushes after
// every write so that a running TensorBoard sees each step at once. Not
// thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

using Scalars = std::vector<std::pair<std::string, double>>;

// The serialized Event protos (no framing).
std::string EncodeFileVersionEvent(double wall_time);
std::string EncodeScalarsEvent(double wall_time, int64_t step, const Scalars& scalars);
// One TFRecord around `data`.
std::string FrameTfRecord(const std::string& data);

class TfEventsWriter {
 public:
  // Creates DIR/events.out.tfevents.<unix seconds>.<hostname> and writes
  // the file_version record.
  static absl::StatusOr<std::unique_ptr<TfEventsWriter>> Create(const std::filesystem::path& dir, double wall_time);
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  absl::Status Write(double wall_time, int64_t step, const Scalars& scalars);
  const std::filesystem::path& path() const { return path_; }

 private:
  TfEventsWriter(std::filesystem::path path, std::ofstream out) : path_(std::move(path)), out_(std::move(out)) {}
  absl::Status Append(const std::string& event);

  const std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace tandem::cli
