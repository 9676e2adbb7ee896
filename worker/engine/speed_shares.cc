#include "worker/engine/speed_shares.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/engine/job_context.h"

namespace tandem::worker {

std::vector<int64_t> SpeedCounts(int64_t total, const std::vector<double>& speeds) {
  const std::vector<size_t> counts =
      comm::SplitWeighted(static_cast<size_t>(std::max<int64_t>(total, 0)), comm::SpeedWeights(speeds), 1);
  return std::vector<int64_t>(counts.begin(), counts.end());
}

rl::IndexRange SpeedSlice(int64_t total, int rank, const std::vector<double>& speeds) {
  const std::vector<int64_t> counts = SpeedCounts(total, speeds);
  int64_t begin = 0;
  for (int r = 0; r < rank; ++r) begin += counts[r];
  return rl::IndexRange{begin, begin + counts[rank]};
}

absl::Status CheckSpeed(double speed, const char* what) {
  if (!std::isfinite(speed) || speed <= 0 || speed > kMaxSpeed) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": speed must be a finite number in (0, ", kMaxSpeed, "], got ", speed));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CalibrateSpeed(kernels::Ops& ops, kernels::DeviceMemory& memory) {
  constexpr int kN = 256, kProducts = 16, kMinTrials = 5, kMaxTrials = 2000;
  const size_t elems = static_cast<size_t>(kN) * kN;
  kernels::DeviceArray<float> a, b, c;
  if (!a.Allocate(&memory, elems) || !b.Allocate(&memory, elems) || !c.Allocate(&memory, elems)) {
    return absl::ResourceExhaustedError("speed calibration: cannot allocate three 256 x 256 matrices");
  }
  std::vector<float> host(elems);
  for (size_t i = 0; i < elems; ++i) host[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
  a.Upload(host.data(), elems);
  b.Upload(host.data(), elems);
  float sink = 0;
  ops.matmul(false, false, kN, kN, kN, 1.f, a.data(), kN, b.data(), kN, 0.f, c.data(), kN);
  c.Download(&sink, 1);  // waits for the device
  // Whole trials until kCalibrationSeconds have passed: the speed is the
  // work over the whole time, so the stalls of a CPU quota count.
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  int trials = 0;
  while (trials < kMinTrials || (seconds < kCalibrationSeconds && trials < kMaxTrials)) {
    for (int p = 0; p < kProducts; ++p) {
      ops.matmul(false, false, kN, kN, kN, 1.f, a.data(), kN, b.data(), kN, 0.f, c.data(), kN);
    }
    c.Download(&sink, 1);
    ++trials;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (!memory.ok()) return absl::InternalError("speed calibration: " + memory.last_error());
  const double flops = 2.0 * kN * kN * kN * kProducts * trials;
  return std::min(kMaxSpeed, flops / std::max(seconds, 1e-9) * 1e-9);
}

namespace {
// Every rank's value of `mine` (a float each: one allreduce where each rank
// fills its own slot; a sum with zeros is exact).
absl::StatusOr<std::vector<double>> GatherValues(JobContext& ctx, double mine) {
  std::vector<float> buf(ctx.world, 0.f);
  buf[ctx.rank] = static_cast<float>(mine);
  if (ctx.world > 1) {
    if (absl::Status st = ctx.collective->allreduce(buf.data(), buf.size(), comm::ReduceOp::kSum, ctx.timeout);
        !st.ok()) {
      return st;
    }
  }
  return std::vector<double>(buf.begin(), buf.end());
}
}  // namespace

absl::Status ExchangeSpeeds(JobContext& ctx, double hint, tandem::v1::ReportPhaseRequest* report) {
  if (hint != 0) {
    if (absl::Status st = CheckSpeed(hint, "tandem-worker --speed"); !st.ok()) return st;
  }
  auto hints = GatherValues(ctx, hint);
  if (!hints.ok()) return hints.status();
  const bool all_hinted = std::all_of(hints->begin(), hints->end(), [](double s) { return s > 0; });
  std::vector<double> speeds;
  double mine = hint;
  if (all_hinted) {
    speeds = *std::move(hints);
  } else {
    auto measured = CalibrateSpeed(*ctx.device->ops, *ctx.device->memory);
    if (!measured.ok()) return measured.status();
    mine = std::max(*measured, 1e-6);
    auto all = GatherValues(ctx, mine);
    if (!all.ok()) return all.status();
    speeds = *std::move(all);
  }
  for (size_t r = 0; r < speeds.size(); ++r) {
    if (absl::Status st = CheckSpeed(speeds[r], absl::StrCat("rank ", r).c_str()); !st.ok()) return st;
  }
  ctx.speeds = std::move(speeds);
  (*report->mutable_values())["speed"] = mine;
  (*report->mutable_values())["speed_calibrated"] = all_hinted ? 0 : 1;
  report->add_log_lines(
      absl::StrCat("shard_by_speed: rank speeds [",
                   absl::StrJoin(ctx.speeds, ", ",
                                 [](std::string* out, double s) { absl::StrAppend(out, absl::StrFormat("%.4g", s)); }),
                   "] (", all_hinted ? "--speed hints" : "calibrated, GFLOP/s", ")"));
  return absl::OkStatus();
}

}  // namespace tandem::worker
