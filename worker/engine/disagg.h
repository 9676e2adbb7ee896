// Disaggregated mode (Echo; placement.mode: disaggregated): separate rollout
// and trainer ranks in one job of world R + T.
//
// Ranks 0..T-1 train: ZeRO over the T trainers on their own communicator
// ("train"; JobContext.collective, with ctx.rank/world = trainer rank/T, so
// SFT, EVAL, UPDATE, CHECKPOINT and EXPORT run unchanged on trainers only).
// Ranks T..T+R-1 generate: a full fp32 copy of the weights, no optimizer;
// every phase but SYNC_WEIGHTS and ROLLOUT is a no-op there. A second
// communicator over all R + T ranks ("all") carries the bulk data:
//   SYNC_WEIGHTS(s): trainers gather the full parameters (ZeRO), trainer 0
//     broadcasts them with the policy version on "all"; rollout ranks load
//     them. It opens every RL step (before ROLLOUT), so warm start, restore
//     and recovery need no other path. With rollout.tp_size = P > 1 the
//     rollout ranks form TP groups of P consecutive rollout ranks (Megatron
//     slices, worker/rollout/tp_slice.h): rollout rank j holds only the
//     slice of TP rank j % P, and trainer j % T cuts it from its full copy
//     and sends it to j alone (send/recv on "all"), so a sync moves R slices
//     instead of R full models (weight_sync_bytes vs weight_sync_full_bytes).
//   ROLLOUT(s): rollout ranks produce step s's prompts (prompts split over
//     the R rollout ranks, same prompt/sampling keys as the co-located mode)
//     and every rank allgathers the packed batches (disagg_transfer.h); with
//     TP, the ranks of a group generate the prompts of all its ranks
//     together over the TP engine and each packs its own share, so the
//     trainers receive what they receive at tp_size 1;
//     trainers drop groups older than the staleness bound, take whole groups
//     (trainer t: its contiguous share) and continue with SCORE, LOGPROBS,
//     UPDATE as in the co-located mode.
// Coupling sync: rollout of step s runs inside ROLLOUT(s) with the weights of
// SYNC_WEIGHTS(s) - staleness is always 0 (checked; a stale trajectory fails
// the step). Coupling async (max_staleness K >= 1): a generation thread on
// each rollout rank keeps producing the next steps' batches with the newest
// weights it has, at most K steps ahead of the newest SYNC_WEIGHTS, so the
// generation of step s+1.. overlaps the trainers' SCORE/LOGPROBS/UPDATE of
// step s; ROLLOUT(s) takes the buffered batch of step s. Trajectories older
// than K versions are dropped (never by construction; the filter guards)
// and counted in the ROLLOUT metrics (trajectories_dropped, staleness_max,
// staleness_mean). K = 0 with async behaves as sync. With TP, the ranks of a
// group must run each step with one weights version: before generating
// step n, their threads agree (a min all-reduce on the TP group) on the
// newest sync step all of them hold (>= n - K) and take its slice from a
// history of the last K + 1 syncs; the trainers check that the batches of a
// group carry one version.
//
// Threads: the job thread runs the phases and every collective except the
// TP group's; the async generation thread computes and, with TP, alone uses
// the TP group's communicator (ctx.tp_group; the engine's abort signal
// aborts it). ~DisaggState joins it; JobContext destroys DisaggState before
// the model and generator it uses. Abort() may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/collective.h"
#include "worker/engine/disagg_transfer.h"
#include "worker/engine/engine.h"
#include "worker/engine/job_context.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::worker {

using tandem::v1::ReportPhaseRequest;

enum class DisaggRole { kTrain, kRollout };

class DisaggState {
 public:
  DisaggState() = default;
  ~DisaggState();
  DisaggState(const DisaggState&) = delete;
  DisaggState& operator=(const DisaggState&) = delete;

  // Makes every wait (and every call on the "all" communicator) fail.
  void Abort();

  DisaggRole role = DisaggRole::kTrain;
  int global_rank = 0;
  int global_world = 1;
  int train_world = 1;
  int rollout_world = 1;
  bool async = false;
  int64_t max_staleness = 0;
  std::unique_ptr<comm::Collective> all;  // R + T ranks; job thread only
  // rollout.tp_size (1: every rollout rank holds the full weights) and the
  // slice maps of TP ranks 0..tp_size-1 (empty at tp_size 1).
  int tp_size = 1;
  std::vector<rollout::TpSliceMap> tp_maps;
  // Rollout ranks generate on their own thread (async with K >= 1).
  bool threaded() const { return async && max_staleness > 0; }

  // Rollout ranks: the newest weights (with TP, this rank's slice in the
  // slice layout) and their version (job thread writes;
  // the generation thread reads under mu_ and keeps its own reference).
  std::shared_ptr<std::vector<float>> weights;
  int64_t weights_version = 0;
  int64_t synced_step = 0;  // step of the newest SYNC_WEIGHTS (0 = none)
  // The generating thread's device copy of `weights` (unused on host
  // memory) and the version it holds.
  kernels::DeviceArray<float> weights_device;
  int64_t weights_device_version = -1;
  // Async with TP (under mu): sync step -> (version, slice) of the last
  // K + 1 syncs.
  std::map<int64_t, std::pair<int64_t, std::shared_ptr<std::vector<float>>>> slice_history;

  // Async rollout ranks.
  void StartOrWake(JobContext& ctx);  // after each SYNC_WEIGHTS
  // Waits (up to `timeout`) for the batch of `step`; drops older batches.
  absl::StatusOr<disagg::RolloutBatch> TakeBatch(int64_t step, comm::Timeout timeout);

  std::mutex mu;  // guards weights, weights_version, synced_step and below

 private:
  void GenerateLoop(JobContext* ctx);

  std::condition_variable cv_;
  std::deque<disagg::RolloutBatch> ready_;
  int64_t next_step_ = 0;  // the batch the thread generates next
  bool stop_ = false;
  absl::Status error_;  // the generation thread's failure (sticky)
  std::thread thread_;
};

// From SETUP, after the store exists: builds the communicators ("all", then
// "train" among trainers), sets ctx.disagg, ctx.collective (trainers),
// ctx.rank/ctx.world to the rank within the role. Fails on an inconsistent
// placement (assignment role, world, prompts not divisible by trainers).
absl::StatusOr<DisaggRole> SetupDisaggregated(JobContext& ctx, const comm::CollectiveOptions& base);
// Rollout ranks finish SETUP here: `initial` are the full weights (version
// 0); with TP the rank keeps its slice of them.
absl::Status FinishRolloutSetup(JobContext& ctx, std::vector<float> initial, ReportPhaseRequest* report);

// The engine's hook: handles `cmd` when its meaning differs in the
// disaggregated mode (SYNC_WEIGHTS, ROLLOUT; everything on rollout ranks;
// UPDATE of a step whose trajectories were all dropped); nullopt: run the
// co-located phase.
std::optional<absl::Status> RunDisaggPhase(JobContext& ctx, const tandem::v1::PhaseCommand& cmd,
                                           ReportPhaseRequest* report);

}  // namespace tandem::worker
