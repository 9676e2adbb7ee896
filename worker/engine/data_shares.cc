#include "worker/engine/data_shares.h"

#include <string>

#include "worker/engine/job_context.h"
#include "worker/engine/speed_shares.h"

namespace tandem::worker {

absl::Status ValidateShares(const tandem::v1::Assignment& a) {
  const int w = a.logical_world_size();
  if (w == 0) {
    if (a.logical_rank_begin() != 0 || a.logical_rank_end() != 0 || a.own_logical_rank() != 0) {
      return absl::InvalidArgumentError("assignment: logical ranks given without logical_world_size");
    }
    return absl::OkStatus();
  }
  const int b = a.logical_rank_begin(), e = a.logical_rank_end(), own = a.own_logical_rank();
  if (w < a.world_size() || b < 0 || b >= e || e > w || own < b || own >= e) {
    return absl::InvalidArgumentError("assignment: logical shares [" + std::to_string(b) + ", " + std::to_string(e) +
                                      ") with own " + std::to_string(own) + " are not a block of " + std::to_string(w) +
                                      " shares for a world of " + std::to_string(a.world_size()));
  }
  return absl::OkStatus();
}

std::vector<DataShare> MyShares(const JobContext& ctx, int64_t total) {
  const auto& a = ctx.assignment;
  std::vector<DataShare> out;
  if (a.logical_world_size() <= 0 && !ctx.speeds.empty()) {
    out.push_back({ctx.rank, SpeedSlice(total, ctx.rank, ctx.speeds), false});
    return out;
  }
  if (a.logical_world_size() <= 0) {
    out.push_back({ctx.rank, rl::RankSlice(total, ctx.rank, ctx.world), false});
    return out;
  }
  for (int l = a.logical_rank_begin(); l < a.logical_rank_end(); ++l) {
    out.push_back({l, rl::RankSlice(total, l, a.logical_world_size()), l != a.own_logical_rank()});
  }
  return out;
}

rl::IndexRange MyRange(const JobContext& ctx, int64_t total) {
  const auto shares = MyShares(ctx, total);
  return rl::IndexRange{shares.front().range.begin, shares.back().range.end};
}

bool CheapBackward(const JobContext& ctx, const DataShare& share) {
  return share.taken_over && ctx.spec().recovery().degraded_cheap_backward();
}

model::ForwardOptions ShareForward(const JobContext& ctx, const DataShare& share) {
  model::ForwardOptions fo;
  fo.recompute_mlp = CheapBackward(ctx, share);
  return fo;
}

model::BackwardOptions ShareBackward(const JobContext& ctx, const DataShare& share, int64_t step, int64_t pass) {
  model::BackwardOptions bo;
  bo.skip_attention = CheapBackward(ctx, share);
  if (share.taken_over && ctx.spec().recovery().degraded_low_rank() > 0) {
    bo.low_rank = ctx.spec().recovery().degraded_low_rank();
    // SplitMix64 over (seed, step, share, pass): never rank or wall clock.
    uint64_t h = ctx.spec().seed();
    for (uint64_t v :
         {static_cast<uint64_t>(step), static_cast<uint64_t>(share.logical_rank), static_cast<uint64_t>(pass)}) {
      h += 0x9E3779B97F4A7C15ull + v;
      h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
      h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
      h ^= h >> 31;
    }
    bo.low_rank_seed = h;
  }
  return bo;
}

}  // namespace tandem::worker
