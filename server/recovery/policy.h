// Recovery policy: the pure decisions the job driver makes when a
// worker of a running job is lost - which failures are the communicator's
// (recover) rather than the job's (fail), which ranks the new generation
// has, whether the lost ranks' state can come from a neighbour's memory
// (Gemini-style copies: rank r's shard is held by rank r+1 mod N), and
// which disk checkpoint to restore. No I/O except CheckpointVisible().
// Thread-compatible (free functions).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tandem/v1/config.pb.h"
#include "tandem/v1/control.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

inline constexpr int64_t kDefaultReplacementTimeoutMs = 30000;
inline constexpr int kDefaultMaxRecoveries = 20;
inline constexpr int64_t kDefaultPreemptCheckpointBudgetMs = 10000;

struct RecoveryPolicy {
  int64_t replacement_timeout_ms = kDefaultReplacementTimeoutMs;
  int max_recoveries = kDefaultMaxRecoveries;
  int64_t preempt_checkpoint_budget_ms = kDefaultPreemptCheckpointBudgetMs;
  bool peer_copies = true;
  int min_workers = 0;    // elastic floor (== workers: not elastic)
  bool degraded = false;  // MeCeFO: survivors take over lost shares at once
};
// The job spec's recovery keys override the coordinator's; zero = default.
RecoveryPolicy EffectiveRecoveryPolicy(const tandem::v1::CoordinatorConfig& config, const tandem::v1::JobSpec& spec);

// A candidate worker for the new generation.
struct Candidate {
  std::string id;
  std::string name;
};

struct RankPlan {
  std::vector<std::string> worker_ids;  // by new rank
  std::vector<int> replaced_ranks;      // ranks filled by a new worker (same world only)
  bool same_world = true;
};

// Survivors keep their ranks; missing ranks are filled from `idle` (a
// worker whose name is the lost rank's old name first: a restarted worker
// takes its old rank). Returns nullopt when there are too few workers for
// `world`. With world < old size (elastic) survivors come first in old rank
// order, then replacements.
std::optional<RankPlan> PlanRanks(const std::vector<std::string>& old_ids,
                                  const std::map<std::string, std::string>& old_names,
                                  const std::set<std::string>& survivors, const std::vector<Candidate>& idle,
                                  int world);

// Peer-memory restore is possible when the world is unchanged, copies exist
// of `peer_step` at that world size, and every replaced rank's holder
// (rank + 1 mod N) survived.
bool PeerRestorePossible(const RankPlan& plan, int old_world, int64_t peer_step, int peer_world);

// The newest usable disk checkpoint: skips `bad` ones; prefers those visible
// on this machine (manifest present) but, when none is, trusts the records
// (the runs dir may be storage the coordinator does not mount).
std::optional<tandem::v1::CheckpointRecord> ChooseCheckpoint(const std::vector<tandem::v1::CheckpointRecord>& records,
                                                             const std::set<std::string>& bad);
bool CheckpointVisible(const std::string& path);

// Degraded continuation: the logical data shares of the survivors. The old
// generation's rank r computed shares [begin[r], begin[r+1]) (the last up to
// `logical_world`) and owns share own[r]; empty vectors mean the normal
// layout (rank r computes share r). `surviving_ranks` are old ranks in
// ascending order; they become new ranks 0.. in that order. A lost rank's
// shares go to the survivor before it (a lost prefix to the first
// survivor), so each survivor still computes one contiguous block.
struct LogicalShares {
  std::vector<int> begin;  // by new rank
  std::vector<int> own;
};
LogicalShares DegradedShares(const std::vector<int>& old_begin, const std::vector<int>& old_own,
                             const std::vector<int>& surviving_ranks, int old_world);

// "…/step-00000020" -> 20; -1 when the name does not say.
int64_t StepFromCheckpointPath(const std::string& path);

}  // namespace tandem::server
