// Data shares: how a step's items (SFT examples, GRPO prompts, evaluation
// examples) are split over the job's ranks.
//
// Normally rank r of N computes RankSlice(total, r, N). With
// cluster.shard_by_speed (JobContext.speeds) rank r computes block r of
// SpeedCounts(total, speeds) instead: contiguous blocks in rank order,
// proportional to speed (speed_shares.h). In degraded
// continuation (RecoverySpec.degraded, MeCeFO) the survivors of a
// lost worker keep the split of the full job: the batch is cut into
// W = Assignment.logical_world_size shares (RankSlice(total, l, W)) and each
// rank computes the contiguous block [logical_rank_begin, logical_rank_end)
// of them; own_logical_rank is its own share, the others are taken over from
// lost ranks. The union over ranks is the same set of items, and the
// per-share micro-batches are the ones of the full-size job, so a degraded
// step computes the same update (up to fp summation order).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/model/model.h"
#include "worker/rl/sft_data.h"

namespace tandem::worker {

struct JobContext;

struct DataShare {
  int logical_rank = 0;
  rl::IndexRange range;     // items of this share
  bool taken_over = false;  // a lost rank's share (not this rank's own)
};

// Checks the logical-share fields of an assignment (all zero = normal).
absl::Status ValidateShares(const tandem::v1::Assignment& a);

// This rank's shares of `total` items, in order (one share when the job is
// not degraded). Their ranges are contiguous and consecutive.
std::vector<DataShare> MyShares(const JobContext& ctx, int64_t total);

// The union of MyShares(ctx, total): one contiguous range.
rl::IndexRange MyRange(const JobContext& ctx, int64_t total);

// Whether a share's micro-batches are computed in MeCeFO's cheaper mode
// (recovery.degraded_cheap_backward and a taken-over share): the backward
// skips the attention sub-block and the forward keeps no MLP activations.
bool CheapBackward(const JobContext& ctx, const DataShare& share);

// The model options of one micro-batch of `share`. A taken-over share gets
// the cheaper mode (above) and, with recovery.degraded_low_rank = R > 0,
// rank-R FFN weight gradients whose projection is drawn from (job seed,
// step, logical share, pass); an own share gets the exact defaults.
model::ForwardOptions ShareForward(const JobContext& ctx, const DataShare& share);
model::BackwardOptions ShareBackward(const JobContext& ctx, const DataShare& share, int64_t step, int64_t pass);

}  // namespace tandem::worker
