// Sharded checkpoints (one file per rank plus a manifest).
//
// Layout of a checkpoint root (e.g. RUN/checkpoints):
//   step-00000020/           a complete checkpoint (visible only when whole)
//     manifest.json          step, world size, ZeRO stage, generation, RNG
//                            and data cursor, policy version, config hash,
//                            one {file, rank, bytes, xxh64} per shard
//     shard-00000-of-00002.bin
//     shard-00001-of-00002.bin
//   step-00000040.partial/   being written: ignored by readers
//
// Shard file: "TNDMSHRD" magic, u32 version, u32 header length, a JSON header
// {"ranges": [[offset, count], ...], "arrays": ["params", "exp_avg", ...]},
// then for each array the floats of the ranges in order. The ranges are
// offsets into the model's flat parameter vector, so a checkpoint written
// with N ranks at any ZeRO stage can be reassembled and loaded with M ranks
// at any stage (LoadCheckpoint returns full arrays).
//
// Durability: every file is written to a temporary name, fsynced, renamed,
// and the directory fsynced; the step directory is renamed from .partial to
// its final name only after every shard and the manifest are durable. The
// xxh64 of every shard is in the manifest and verified on load: a flipped
// byte, a truncated file or a missing shard is an error (DataLoss/NotFound)
// naming the file, and FindLatestValid() falls back to the previous complete
// checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::ckpt {

struct Range {
  uint64_t offset = 0;
  uint64_t count = 0;
};

// One rank's part of the training state: the same `ranges` for every array;
// each array holds sum(count) floats.
struct ShardState {
  int rank = 0;
  std::vector<Range> ranges;
  std::vector<std::pair<std::string, std::vector<float>>> arrays;
  uint64_t num_floats() const;
};

struct ShardFileInfo {
  std::string file;  // name inside the step directory
  int rank = 0;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct Manifest {
  int64_t step = 0;
  int world_size = 1;
  int zero_stage = 0;
  int64_t generation = 0;
  int64_t policy_version = 0;
  int64_t optimizer_steps = 0;
  uint64_t total_floats = 0;  // length of the full flat vector
  std::string config_hash;    // of the job spec parts that shape the state
  std::string rng_state;      // counter-based RNG: the keys and counters
  std::string data_cursor;    // where the data stream continues
  std::string trainable;      // train.trainable patterns joined by ", " ("" = every parameter)
  std::map<std::string, double> extra;
  std::vector<ShardFileInfo> shards;
};

std::string StepDirName(int64_t step);
std::string ShardFileName(int rank, int world_size);

// Writes `state` as DIR/ShardFileName(rank, world) atomically and durably;
// returns its size and checksum. DIR is created if missing.
absl::StatusOr<ShardFileInfo> WriteShard(const std::string& dir, int world_size, const ShardState& state);
// Reads and verifies one shard (size and checksum from `info`).
absl::StatusOr<ShardState> ReadShard(const std::string& dir, const ShardFileInfo& info);

// The {file, rank, bytes, xxh64} record a rank publishes in the rendezvous
// store after writing its shard, and its parser for rank 0 (which writes the
// manifest): every field checked, the file must be rank's own, never throws.
std::string ShardAnnouncement(const ShardFileInfo& info);
absl::StatusOr<ShardFileInfo> ParseShardAnnouncement(const std::string& text, int rank, int world);

// Writes DIR/manifest.json atomically.
absl::Status WriteManifest(const std::string& dir, const Manifest& manifest);
absl::StatusOr<Manifest> ReadManifest(const std::string& dir);

// Size on disk of the checkpoint in DIR that `manifest` describes: every
// shard file it lists (the sizes recorded when they were written, which
// ReadShard checks) plus DIR/manifest.json. NotFound if there is no manifest.
absl::StatusOr<uint64_t> CheckpointBytes(const std::string& dir, const Manifest& manifest);

// Publishes a checkpoint: renames root/step-N.partial to root/step-N and
// fsyncs root. The partial directory must hold every shard and the manifest.
absl::Status Publish(const std::string& root, int64_t step);
std::string PartialDir(const std::string& root, int64_t step);
std::string FinalDir(const std::string& root, int64_t step);

// A loaded checkpoint, reassembled into full flat arrays.
struct LoadedCheckpoint {
  Manifest manifest;
  std::string dir;
  std::map<std::string, std::vector<float>> arrays;  // each total_floats long
};
// Verifies every shard (checksums, coverage of [0, total_floats) exactly
// once) and reassembles.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir);

// Complete checkpoints under root, newest first (by step).
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root);
// The newest checkpoint that loads; `skipped` receives "dir: reason" for each
// newer one that did not (corrupt, truncated, missing shard).
absl::StatusOr<LoadedCheckpoint> LoadLatestValid(const std::string& root, std::vector<std::string>* skipped);
// Deletes all but the newest `keep` complete checkpoints and any stale
// .partial directories older than the newest complete one.
absl::Status ApplyRetention(const std::string& root, int keep);

uint64_t Xxh64(const void* data, size_t bytes);

}  // namespace tandem::ckpt
