// Disaggregated mode (Echo): the trajectory hand-off from rollout ranks to
// trainer ranks, as pure functions.
//
// - Pack/Unpack: one rollout rank's batch of a step as 32-bit words carried
//   in float slots (collectives copy bits; nothing is reduced), so a batch
//   travels through Collective::allgather. Unpack validates every length.
// - SelectForTrainer: from the step's trajectories of all rollout ranks (every
//   trainer sees the same list, so every trainer decides the same), drop the
//   groups older than max_staleness policy versions (rl::DropStale), keep a
//   multiple of train_world groups (equal work per trainer, which ZeRO-2/3
//   needs), and return trainer `train_rank`'s contiguous share of whole groups
//   with the counts and staleness figures of the step.
// Thread-safe (no state).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/rl/rollout.h"

namespace tandem::worker::disagg {

// One rollout rank's trajectories of one step, group-major (G per prompt).
struct RolloutBatch {
  int64_t step = 0;  // RL step whose prompts were generated
  std::vector<rl::Trajectory> trajectories;
  int64_t generated_tokens = 0;
  double generate_seconds = 0;  // wall time of the generation
};

std::vector<float> Pack(const RolloutBatch& batch);
absl::StatusOr<RolloutBatch> Unpack(std::span<const float> words);

struct Selection {
  std::vector<rl::Trajectory> mine;  // this trainer's groups, group order
  int64_t received = 0;              // trajectories of the step, all ranks
  int64_t kept = 0;                  // trained on, all trainers together
  int64_t dropped_stale = 0;         // older than max_staleness
  int64_t dropped_uneven = 0;        // left over after splitting by trainers
  int64_t max_staleness = 0;         // over kept trajectories
  double mean_staleness = 0;         // over kept trajectories
};

// Fails when a group is incomplete (not group_size trajectories), when the
// trajectories of one group carry different versions, or when a version is
// newer than current_version.
absl::StatusOr<Selection> SelectForTrainer(std::vector<rl::Trajectory> all, int64_t current_version,
                                           int64_t max_staleness, int group_size, int train_rank, int train_world);

}  // namespace tandem::worker::disagg
