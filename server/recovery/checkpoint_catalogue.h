// CheckpointCatalogue: one job's disk checkpoints as the coordinator knows
// them - the records its ranks published (state store table checkpoints:
// step, path, generation, world size, bytes; the newest checkpoint.keep
// steps kept, as the workers' retention deletes older ones) and the paths
// found unusable (DriverState.bad_checkpoints: a restore failed or workers
// died restoring them). It chooses the restore source of a recovery: the
// newest usable checkpoint, else the job's resume_from, else scratch.
// Thread-compatible: a job's driver uses it under the job's lock; it holds
// no lock of its own besides the StateStore's.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store/state_store.h"
#include "tandem/v1/control.pb.h"
#include "tandem/v1/driver_state.pb.h"

namespace tandem::server {

// The newest visible checkpoints per job the catalogue keeps when the job
// sets no checkpoint.keep (older ones stay on disk, unlisted).
inline constexpr int64_t kMaxCheckpointRecordsPerJob = 1000;

struct RestoreSource {
  std::string path;   // "" = from scratch
  int64_t step = -1;  // the recorded step; -1 for resume_from or scratch
};

class CheckpointCatalogue {
 public:
  // `state` holds the bad list and outlives the catalogue.
  CheckpointCatalogue(StateStore* store, std::string job_id, tandem::v1::DriverState* state);

  // Records a checkpoint a rank published; false when it was recorded
  // already. Keeps the newest `keep` steps (0 or more than
  // kMaxCheckpointRecordsPerJob: that many).
  // A path published again (a redo rewrote it) is usable again.
  absl::StatusOr<bool> Publish(const tandem::v1::CheckpointRecord& record, int64_t keep);
  // Publish without waiting: queues the record and the pruning and returns
  // the ticket to wait for (StateStore::WaitDurable); 0 when it was recorded
  // already.
  absl::StatusOr<WriteTicket> Record(const tandem::v1::CheckpointRecord& record, int64_t keep);
  absl::StatusOr<std::vector<tandem::v1::CheckpointRecord>> List() const;
  // The newest recorded step; -1 when none (or the store cannot say).
  int64_t NewestStep() const;
  // The newest usable checkpoint (see ChooseCheckpoint in policy.h).
  std::optional<tandem::v1::CheckpointRecord> NewestUsable() const;
  // The newest usable checkpoint, else `resume_from` unless it is bad, else
  // scratch.
  RestoreSource ChooseRestore(const std::string& resume_from) const;
  // Marks `path` unusable: never chosen again until published again. False
  // when it already was.
  bool MarkBad(const std::string& path);
  bool IsBad(const std::string& path) const;

 private:
  std::set<std::string> Bad() const;

  StateStore* const store_;
  const std::string job_id_;
  tandem::v1::DriverState* const state_;
};

}  // namespace tandem::server
