// Speed-proportional shards (cluster.shard_by_speed): every rank's speed,
// agreed at SETUP, sets its share of each batch (SpeedSlice) and of the ZeRO
// partition (zero::ZeroOptions.partition_weights), so a slow worker does not
// hold the fast ones back.
//
// Speeds: each worker's hint (tandem-worker --speed, > 0) when every rank has
// one; otherwise every rank measures itself with CalibrateSpeed (a fixed
// GEMM workload) and the measured figures are used. ExchangeSpeeds shares
// them through the job's communicator (one allreduce in which each rank
// fills its own slot, so every rank holds the same table, bit for bit).
//
// Batch rounding (SpeedCounts): every rank first gets one item (when the
// batch has at least one item per rank), the rest is split in proportion to
// the speeds by the largest-remainder method in integers (comm::SplitWeighted
// over comm::SpeedWeights); ranks take contiguous blocks in rank order. The
// union over ranks is the whole batch, and the loss normalisers stay the
// global counts, so the step computes the same update as the even split up to
// fp32 summation order.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/rl/sft_data.h"

namespace tandem::kernels {
class Ops;
class DeviceMemory;
}  // namespace tandem::kernels

namespace tandem::worker {

struct JobContext;

// Items per rank of a batch of `total` (the rule above).
std::vector<int64_t> SpeedCounts(int64_t total, const std::vector<double>& speeds);
// Rank `rank`'s block of SpeedCounts(total, speeds).
rl::IndexRange SpeedSlice(int64_t total, int rank, const std::vector<double>& speeds);

// InvalidArgument unless speed is finite and in (0, kMaxSpeed].
inline constexpr double kMaxSpeed = 1e6;
absl::Status CheckSpeed(double speed, const char* what);

// Measures this worker's sustained speed: C = A * B with 256 x 256 fp32
// matrices on `ops` (the job's compute device) after one warm-up product,
// in trials of 16 products, at least 5 trials and until
// kCalibrationSeconds of wall time have passed (at most 2000 trials);
// returns the GFLOP/s of all trials over their whole time. The window spans
// more than two periods of a CFS CPU quota (100 ms by default), so a
// throttled worker measures its throttled speed, not the bursts between
// stalls.
inline constexpr double kCalibrationSeconds = 0.25;
absl::StatusOr<double> CalibrateSpeed(kernels::Ops& ops, kernels::DeviceMemory& memory);

// Collective (every rank calls): fills ctx.speeds with every rank's speed
// (hint = this worker's --speed, 0 = none; see the header comment) and
// reports this rank's speed ("speed", "speed_calibrated") and the table.
absl::Status ExchangeSpeeds(JobContext& ctx, double hint, tandem::v1::ReportPhaseRequest* report);

}  // namespace tandem::worker
