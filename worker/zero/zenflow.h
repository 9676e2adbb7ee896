// ZenFlow: an offloaded AdamW for the ZeRO optimizer (stages 0-2, fp32) that
// splits every weight matrix by gradient importance.
//
// Rows: the unit of selection is a row of a row-major [rows, cols] weight
// matrix (an output channel of an [out, in] projection, a token of the
// embedding) as far as it lies in this rank's owned range; a row cut by a
// shard boundary is two rows, one per owner. Elements outside any matrix
// (norms, biases, padding) are always important.
//
// Warm-up: steps 1..full_warm_up_steps W (a multiple of S; default 0) are
// plain AdamW on every row, as DeepSpeed's full_warm_up_rounds.
// Per step after it (Step, after the gradient is reduced and clipped):
//   - the owned gradient is copied to the host;
//   - on the first step after the warm-up, and at every step that is a multiple of
//     select_interval N (N is a multiple of update_interval S), each matrix
//     piece's rows are ranked by the L2 norm of this step's gradient; the
//     top ceil(topk_fraction x rows) are important (ties: lower row first);
//   - important rows get a plain AdamW update on the device from the
//     current gradient (the Ops kernel, bias correction of the step count);
//   - the other rows' gradients are summed into a host accumulator;
//   - at every step that is a multiple of S, the host update handed over at
//     the previous such step is waited for (it had S steps of device work to
//     hide behind) and its parameters are written to the device; then the
//     accumulator goes to the host thread (zenflow_host.h), which runs AdamW
//     with the mean gradient (sum / S) on host copies of those rows'
//     parameters and moments (bias correction of the host update count
//     W + (step - W) / S) while the device trains on. Its result is applied S steps
//     later, so the unimportant rows lag by one host interval.
// Re-selection (at a multiple of N, after the wait above): a row's moments
// and parameters move with it. A row that becomes important takes its host
// moments to the device, where one AdamW update with its pending mean
// accumulated gradient (host update count as step) runs at once; a row
// that becomes unimportant copies its device parameters and moments to the
// host and starts accumulating from zero; only rows unimportant under both
// selections go into that step's host update.
// With topk_fraction = 1 every row is important and the device calls are
// those of plain AdamW: the result is bit-identical.
//
// Sync (checkpoint, export): waits for and applies the update in flight and
// writes the host moments of unimportant rows into the moment arrays, so
// the parameters and moments are complete; the accumulator and the
// selection are the extra state (CopyState / LoadState).
//
// Host memory: 7 x the owned optimizer elements (gradient copy, two
// accumulators, parameters and two moments). Threads: all methods from the
// job thread; the host updater owns the one extra thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/zero/zenflow_host.h"

namespace tandem::zero {

// A row-major [rows, cols] weight at `offset` floats in the flat parameters.
struct ZenFlowMatrix {
  size_t offset = 0;
  size_t rows = 0;
  size_t cols = 0;
};

struct ZenFlowOptions {
  double topk_fraction = 0;    // 0 = off; (0, 1]
  int update_interval = 4;     // S
  int select_interval = 8;     // N, a multiple of S
  int full_warm_up_steps = 0;  // W, a multiple of S: steps 1..W are plain AdamW
  std::vector<ZenFlowMatrix> matrices;
};

// Host-update timing, summed since the start (seconds).
struct ZenFlowStats {
  double host_update_s = 0;  // host thread computing
  double host_wait_s = 0;    // the job thread waiting for it
  double host_hidden_s = 0;  // host compute that overlapped device work
  int64_t host_updates = 0;
  double important_fraction = 1;  // of the owned matrix rows' elements
};

// One contiguous owned range: `global` (flat parameter index), `opt`
// (moment arrays and host state), `param` and `grad` (device arrays).
struct ZenFlowSegment {
  size_t global = 0;
  size_t opt = 0;
  size_t param = 0;
  size_t grad = 0;
  size_t len = 0;
};

// The device arrays of one call. moments_on_host: m and v are host
// pointers (the optimizer state is offloaded; Sync only).
struct ZenFlowDevice {
  kernels::Ops* ops = nullptr;
  kernels::DeviceMemory* mem = nullptr;
  float* p = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  bool moments_on_host = false;
};

struct ZenFlowAdamW {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
};

class ZenFlow {
 public:
  // InvalidArgument for bad options; segments sorted by `global`, disjoint.
  static absl::StatusOr<std::unique_ptr<ZenFlow>> Create(const ZenFlowOptions& options, const ZenFlowAdamW& adamw,
                                                         std::vector<ZenFlowSegment> segments, size_t opt_size);

  // The update of step `step` (1-based) with learning rate lr; d.g holds the
  // reduced, clipped gradient of the owned range (overwritten for rows that
  // change sets).
  absl::Status Step(const ZenFlowDevice& d, float lr, int64_t step);
  // Waits for and applies the host update in flight; writes the host
  // moments into d.m / d.v. Returns whether device parameters changed.
  bool Sync(const ZenFlowDevice& d);
  // Forgets the host state (no selection, zero accumulators), waiting for
  // the update in flight without applying it: the caller loads parameters
  // and moments afterwards.
  void Reset();
  bool selected() const { return selected_; }
  // State in optimizer coordinates (opt_size floats each): the accumulated
  // gradient and 1 / 0 per element for important / not. Call after Sync.
  void CopyState(float* acc, float* important) const;
  // Restores it; the host copies of parameters and moments are read from d.
  // `step` is the optimizer step count the state belongs to (a selection
  // exists after step full_warm_up_steps).
  void LoadState(const ZenFlowDevice& d, const float* acc, const float* important, int64_t step);
  const ZenFlowStats& stats() const { return stats_; }

 private:
  struct Row {
    size_t opt = 0, param = 0, grad = 0, len = 0;
    int group = -1;  // matrix piece; -1: always important
    int segment = 0;
  };
  struct Group {
    size_t first = 0, count = 0, k = 0;
  };
  struct DevRun {
    size_t opt = 0, param = 0, grad = 0, len = 0;
  };

  ZenFlow(const ZenFlowOptions& options, const ZenFlowAdamW& adamw, size_t opt_size);
  void BuildRows(const std::vector<ZenFlowSegment>& segments);
  // important_ from the row norms of g_host_.
  void Select();
  // dev_runs_ / host_runs_ from important_.
  void RebuildRuns();
  // Copies a row's device parameters and moments to the host copies.
  void MoveToHost(const ZenFlowDevice& d, const Row& row);
  void FinishInFlight(const ZenFlowDevice& d, bool apply);
  void Reselect(const ZenFlowDevice& d, float lr, int64_t step);
  // The bias-correction count of the host moments at step `step`: the
  // warm-up's device updates, then one per host interval.
  int64_t HostCount(int64_t step) const;

  ZenFlowOptions options_;
  ZenFlowAdamW adamw_;
  size_t opt_size_ = 0;
  std::vector<ZenFlowSegment> segments_;
  std::vector<Row> rows_;
  std::vector<Group> groups_;
  std::vector<uint8_t> important_, prev_important_;
  std::vector<double> norms_;
  std::vector<uint32_t> order_;
  std::vector<DevRun> dev_runs_;
  std::vector<ZenFlowHostUpdater::Run> host_runs_, job_runs_;
  std::vector<float> g_host_, acc_[2], hp_, hm_, hv_;
  int cur_ = 0;            // accumulator in use; the other belongs to the host update
  int64_t acc_steps_ = 0;  // steps summed into acc_[cur_]
  bool selected_ = false;
  bool in_flight_ = false;
  ZenFlowStats stats_;
  ZenFlowHostUpdater updater_;  // last: joined before the arrays go
};

}  // namespace tandem::zero
