// In-memory peer copies of the training state (Gemini-style).
//
// After each PHASE_CHECKPOINT every rank keeps its own shard (parameters,
// Adam moments and, for a GRPO job with a KL term, the KL reference policy,
// each over the ranges it owns) in host memory and sends a copy to its
// neighbour rank+1 mod N over the job's communicator (send/recv), keeping
// the copy it receives from rank-1. The copies live in the engine, not in
// the JobContext, so they survive an abort and the next generation's SETUP.
//
// Restore (SETUP with Assignment.peer_restore_step = S): ranks listed in
// peer_restore_ranks (replacements) receive their shard of step S from
// rank+1, which sends the copy it holds; every other rank reloads its own.
// The KL reference is rebuilt in full on every rank from the restored pieces
// (a gather), so a peer restore of a KL job is bit-identical to a disk one.
// All ranks agree (an allreduce of failures) before loading, so a missing or
// mismatching copy fails every rank's SETUP with "peer restore: ..." and the
// coordinator falls back to the disk checkpoint; nobody hangs.
// Thread safety: PeerSnapshots is used from the engine's job thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/ckpt/checkpoint.h"

namespace tandem::worker {

struct JobContext;

// One rank's part of the state at a checkpoint step.
struct SnapshotShard {
  int64_t step = 0;
  int world = 0;
  int zero_stage = 0;
  int rank = 0;  // whose shard this is
  int64_t optimizer_steps = 0;
  int64_t policy_version = 0;
  std::vector<ckpt::Range> ranges;
  std::vector<float> params, exp_avg, exp_avg_sq;
  // GRPO with rl.kl_coef > 0: this rank's pieces (`ranges`) of the frozen
  // KL reference policy; empty when the job has none (yet).
  std::vector<float> ref_params;

  std::string Serialize() const;
  static absl::Status Parse(const std::string& bytes, SnapshotShard* out);
  size_t bytes() const {
    return (params.size() + exp_avg.size() + exp_avg_sq.size() + ref_params.size()) * sizeof(float);
  }
};

class PeerSnapshots {
 public:
  // Drops everything unless it belongs to job_id.
  void KeepOnly(const std::string& job_id);
  void Clear();
  const std::string& job_id() const { return job_id_; }
  std::optional<SnapshotShard>& own() { return own_; }
  std::optional<SnapshotShard>& neighbour() { return neighbour_; }  // rank-1's shard

 private:
  std::string job_id_;
  std::optional<SnapshotShard> own_;
  std::optional<SnapshotShard> neighbour_;
};

// Checkpoint side: keeps `own` and swaps copies with the neighbours; fills
// the report's CheckpointResult (peer_copy, peer_copy_seconds, peer_copy_bytes).
absl::Status ExchangePeerCopies(JobContext& ctx, SnapshotShard own, tandem::v1::ReportPhaseRequest* report);

// SETUP side (see above); fills restored_step, restore_source = 1 (peer),
// restore_seconds.
absl::Status RestoreFromPeers(JobContext& ctx, int64_t step, const std::vector<int>& receive_ranks,
                              tandem::v1::ReportPhaseRequest* report);

}  // namespace tandem::worker
