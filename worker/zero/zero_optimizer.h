// ZeroOptimizer: ZeRO stages 0-3 over a flat fp32 parameter vector of Psi
// elements, and the model's ParamProvider (worker/model/param_provider.h).
//
// Partition (all stages, so checkpoints reshard between stages and N): each
// unit is split into N near-equal contiguous pieces (the first size % N
// pieces one longer); rank r owns piece r of every unit; its shard is the
// concatenation of its pieces in unit order (shard_map()). With
// ZeroOptions.partition_weights (speed-proportional shards) the pieces are
// instead proportional to the ranks' weights (comm::SplitWeighted); every
// collective then moves those unequal counts. Checkpoints store ranges, so
// they reshard between the even and the weighted partition.
//
// Storage: every buffer the optimizer owns lives in backend device memory
// (ZeroOptions.memory: host memory for the CPU backends, cudaMalloc'ed for
// CUDA) and is only touched through DeviceMemory copies and Ops calls, so
// AcquireParams/AcquireGrads, inference_view() and the buffers handed to the
// Collective are device pointers (NCCL / the guarded Gloo wrapper take them).
// The host-facing calls (InitFromFull, GatherFull, Copy/Load*Shard,
// CopyFullState) take HOST pointers and upload / download.
//
// Storage per rank (fp32):
//   stage 0: full params, full grads, full m/v                 16 Psi
//   stage 1: full params, full grads, m/v shard                 8 Psi + 8 Psi/N
//   stage 2: full params, grad shard, m/v shard                 4 Psi + 12 Psi/N
//   stage 3: param shard, grad shard, m/v shard                 16 Psi/N
// plus temporaries: stage 2/3 unit-sized gradient buffers (three, so the
// figure does not depend on timing; ReleaseGrads reduce-scatters a unit's
// gradient into the shard accumulator), stage 3
// unit-sized gather buffers (AcquireParams allgathers a unit; Prefetch starts
// the next one) and, during BeginInference..EndInference, one full copy.
//
// Mixed precision (ZeroOptions.precision = kBf16): the fp32 master weights
// are partitioned by rank (stage 0: full; stages 1-3: the shard), the model
// reads a bf16 compute copy (full at stages 0-2, the shard at stage 3, whose
// per-unit allgather moves bf16), widened to fp32 per unit on AcquireParams
// into a unit-sized scratch returned on ReleaseParams, so the compute sees
// bf16-rounded weights. Gradients, their reductions and the Adam moments stay
// fp32. Step updates the masters and refreshes the compute copy from them
// (each owner rounds its piece to nearest even and the pieces are
// allgathered, so every rank holds the same bits). Per rank:
//   stage 0: 4 Psi master + 2 Psi bf16 + 4 Psi grads + 8 Psi m/v   18 Psi
//   stage 1: 4 Psi/N + 2 Psi + 4 Psi + 8 Psi/N                       6 Psi + 12 Psi/N
//   stage 2: 4 Psi/N + 2 Psi + 4 Psi/N + 8 Psi/N                     2 Psi + 16 Psi/N
//   stage 3: (4 + 2 + 4 + 8) Psi/N                                  18 Psi/N
// Checkpoints, GatherFull and CopyFullState serve the fp32 masters;
// BeginInference / inference_view serve the (widened) bf16 compute copy.
//
// Frozen parameters (ZeroOptions.trainable): only the trainable elements
// have gradients and Adam moments. Their partition is the one the parameter
// partition induces: rank r owns the trainable elements inside its pieces,
// so the owner of a trainable element also owns its master, and checkpoints
// keep the shard_map() format (the moments of frozen elements read as 0).
// Gradients, their reductions and m/v are stored compactly (T trainable
// elements: stages 0-1 hold T gradient floats, stage 0 T moments, stages
// 1-3 this rank's trainable elements); the model writes a unit's gradient
// into a unit-sized buffer whose trainable ranges are added into that
// storage on ReleaseGrads (stages 2-3: after the reduce-scatter; a unit
// without trainable elements is not reduced at all). Parameters are stored
// and gathered as without frozen elements (stage 3 shards all of them).
// Not combined with int4 gradient compression.
// Hierarchical partition (ZeroOptions.hierarchical_partition, stage 3, hpZ
// of ZeRO++): the ranks sit on M nodes of L ranks each (ZeroOptions.intra:
// this node's ranks, rank = local index l; ZeroOptions.inter: the ranks of
// local index l on every node, rank = node index m). Each unit is split into
// L chunks (SplitEven), chunk l into M pieces; rank (m, l) owns piece m of
// chunk l (shard_map() says so; checkpoints store ranges, so they reshard
// to and from the flat partition). Every rank also keeps chunk l of every
// unit (the secondary copy, Psi/L floats), refreshed after each Step by an
// inter-node allgather of the owners' pieces. Forward/backward gathers are
// intra-node allgathers of the chunks; gradients reduce-scatter inside the
// node (to chunks), then across nodes (to pieces). Per rank, the inter-node
// tier carries (M-1)/M x Psi/L floats for the refresh (once per step) and as
// much per gradient reduce-scatter, and nothing for the gathers. Sums run
// in a different order than flat stage 3: equal within fp32 reduction-order
// tolerance. With bf16 precision the secondary copy holds each owner's
// piece of the chunk in bf16 (Psi/L bf16 values, packed per piece as the
// flat bf16 gathers pack them), which is what the forward/backward gathers
// need: they move and widen exactly the bits flat stage 3 bf16 computes
// with. The fp32 masters stay in the shard; exact gathers (GatherFull,
// checkpoints) then go inter-node, then intra-node, as with qwZ.
//
// Quantized weight gathers (ZeroOptions.weight_quantization = kInt8, stage
// 3, qwZ of ZeRO++): the unit gathers move blockwise int8 codes with fp32
// scales (kernels/int8_blocks.h), about 1/4 of the bytes; each
// owner quantises its own piece, so every rank dequantises the same bits.
// The codes round stochastically (kernels/int8_rounding.h) with a seed from
// (ZeroOptions.weight_quantization_seed, step, unit, owner): unbiased, so
// the gathered weights follow the masters in expectation even when an
// update is smaller than a grid step, and the same within a step.
// Forward and backward then compute with the dequantised weights; the fp32
// masters, the optimizer and GatherFull / checkpoints / BeginInference stay
// exact fp32. With hpZ the secondary copy holds the quantised pieces (the
// refresh and the intra-node gathers both move int8). Every backend
// quantises and dequantises with Ops::quantize_int8 / dequantize_int8 in its
// own memory (CUDA: on the device, no host round trip). With bf16 precision
// the pieces are quantised from the fp32 masters and the dequantised unit is
// rounded to bf16, so the compute sees bf16 weights as in the flat bf16
// path; BeginInference serves bf16(masters), the flat bf16 compute copy.
//
// ZenFlow (ZeroOptions.zenflow.topk_fraction > 0; stages 0-2, fp32, no
// frozen parameters, hpZ, int4 gradients nor reduce_on_release): Step's
// AdamW over the owned range is worker/zero/zenflow.h's split update (the
// important rows on the device every step, the others on a host thread
// every update_interval steps). SyncHostUpdates() makes the parameters and
// moments complete (checkpoint, export); the accumulated gradient and the
// selection travel with checkpoints (CopyZenFlowShard / LoadZenFlowState).
//
// Reductions are sums (the engine normalises the loss globally). Gradients
// accumulate over micro-batches until Step; ZeroGrads() clears them.
//
// Threads: all methods are called from one thread (the job thread). The
// optimizer owns one communication thread that runs every collective it
// issues, in submission order (so all ranks issue the same sequence);
// stage 3 prefetches and stage 2/3 gradient reduce-scatters overlap compute
// there. That thread also accumulates each reduce-scattered piece into the
// gradient shard with ZeroOptions.comm_ops (CUDA: a second Ops instance, as
// CudaOps is one per thread). Do not use the Collective yourself while work
// is in flight: call Drain() first (Step, GatherFull, BeginInference drain
// themselves).
//
// Errors: ParamProvider methods cannot return a Status; a failed collective
// or a failed temporary allocation inside them is kept in status() (sticky;
// the Acquire call then returns nullptr) and later Step/Gather calls return
// it. Check status() after each forward/backward. Create fails with
// ResourceExhausted (naming the byte count) when the persistent state does
// not fit; a DeviceMemory error (memory->ok() false) fails the next call
// that returns a Status.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/comm/collective.h"
#include "worker/comm/quantized_collectives.h"
#include "worker/model/param_provider.h"
#include "worker/zero/zenflow.h"

namespace tandem::zero {

struct Unit {
  size_t offset = 0;
  size_t size = 0;
};

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Weights the model computes with: the fp32 master itself, or a bf16
// compute copy of it (see the header comment).
enum class Precision { kFp32, kBf16 };

// "fp32" | "bf16" (the job key train.precision; "" = fp32).
absl::StatusOr<Precision> ParsePrecision(std::string_view name);

// How gradients travel between ranks: fp32, or LoCo's 4-bit blockwise
// quantisation (worker/comm/quantized_collectives.h) with error feedback.
enum class GradCompression { kNone, kInt4 };

// "none" | "int4" (the job key zero.grad_compression; "" = none).
absl::StatusOr<GradCompression> ParseGradCompression(std::string_view name);

// How stage-3 parameter gathers move weights: fp32, or blockwise int8
// (qwZ; see the header comment).
enum class WeightQuantization { kNone, kInt8 };

// "none" | "int8" (the job key zero.weight_quantization; "" = none).
absl::StatusOr<WeightQuantization> ParseWeightQuantization(std::string_view name);

struct ZeroOptions {
  int stage = 0;  // 0..3
  Precision precision = Precision::kFp32;
  std::vector<Unit> units;           // contiguous, covering [0, Psi)
  comm::Collective* comm = nullptr;  // not owned; outlives the optimizer
  kernels::Ops* ops = nullptr;       // not owned (adamw_step, sum_squares,
                                     // scale, float_to_bf16, bf16_to_float)
  // Ops of the communication thread (add_inplace of reduce-scattered
  // gradient pieces); not owned. nullptr: `ops` (fine for the CPU
  // backends, which may be shared; CUDA passes a second instance).
  kernels::Ops* comm_ops = nullptr;
  // Where every buffer lives; not owned, must outlive the optimizer and
  // match `ops`. nullptr: the optimizer makes and owns a host memory.
  kernels::DeviceMemory* memory = nullptr;
  AdamWConfig adamw;
  comm::Timeout timeout{120000};  // per collective
  // kInt4 (N > 1): stages 0-1 allreduce and stages 2-3 reduce-scatter the
  // gradients as int4 pieces, staged through host buffers. With
  // error_feedback each rank keeps its quantisation error (Psi floats on the
  // host, plus a shard at stages 0-1) and adds it to the next reduction.
  GradCompression grad_compression = GradCompression::kNone;
  bool error_feedback = true;
  // Frozen parameters: per unit, the trainable element ranges (offsets
  // within the unit, sorted, disjoint). Empty: everything is trainable; a
  // table that covers every element means the same.
  std::vector<std::vector<Unit>> trainable;
  // Stages 0-1, fp32, N > 1: the caller releases each unit's gradient once
  // per step, when it is complete (layer-major accumulation,
  // worker/model/layer_major.h); ReleaseGrads then allreduces that unit on
  // the communication thread, overlapping the rest of the backward, and
  // Step reduces only units that were not released. Acquiring a unit's
  // gradient again after its reduction, before ZeroGrads/Step, is a
  // programming error (checked). Stages 2-3 reduce-scatter per release
  // either way; with int4 compression the stage 0-1 reduction stays in Step.
  bool reduce_on_release = false;
  // Stage 3 hpZ (see the header comment): needs intra and inter (not owned;
  // outlive the optimizer; intra.size() * inter.size() == comm.size());
  // fp32 or bf16 precision. With kInt4 gradients the inter-node reduce-scatter is
  // the int4 one (error feedback over the chunk, Psi/L floats).
  bool hierarchical_partition = false;
  comm::Collective* intra = nullptr;
  comm::Collective* inter = nullptr;
  // Stage 3, fp32 or bf16, any backend.
  WeightQuantization weight_quantization = WeightQuantization::kNone;
  // ZenFlow split update (see the header comment); off when
  // topk_fraction == 0. The matrices are the model's 2-D weights.
  ZenFlowOptions zenflow;
  // Speed-proportional partition: one integer weight per rank (all > 0;
  // comm::SpeedWeights), identical on every rank. Empty: the even split.
  // Not combined with hpZ, qwZ or int4 gradients (their exchanges assume the
  // even split).
  std::vector<uint64_t> partition_weights;
  // kInt8: the pieces round stochastically (kernels/int8_rounding.h) with a
  // seed derived from (this seed, step, unit, owner), so the gathered
  // weights follow the masters in expectation and every rank sees the same
  // codes.
  uint64_t weight_quantization_seed = 0;
};

struct StepResult {
  double grad_norm = 0;   // global L2 norm of the summed gradient, pre-clip
  double clip_scale = 1;  // factor applied to the gradient (1 = no clipping)
};

struct MemoryReport {
  size_t param_bytes = 0;    // fp32 parameters (the masters)
  size_t compute_bytes = 0;  // bf16 compute copy; hpZ secondary copy
  size_t grad_bytes = 0;
  size_t optimizer_bytes = 0;
  size_t temp_bytes = 0;  // unit buffers, scratch, inference copy
  // Host bytes holding m and v while OffloadOptimizerState is in effect
  // (optimizer_bytes is then 0); not part of total(), which is device bytes.
  size_t offloaded_bytes = 0;
  size_t total() const { return param_bytes + compute_bytes + grad_bytes + optimizer_bytes + temp_bytes; }
  size_t secondary_bytes = 0;  // hpZ secondary copy (part of compute_bytes)
};

// One piece of the shard: elements [unit_offset, unit_offset + size) of
// `unit`, stored at shard_offset in this rank's shard.
struct ShardPiece {
  int unit = 0;
  size_t unit_offset = 0;
  size_t size = 0;
  size_t shard_offset = 0;
};

// Pieces rank `rank` of `world` owns (the partition rule above; `weights`
// empty = the even split, else one weight per rank).
std::vector<ShardPiece> ComputeShardMap(const std::vector<Unit>& units, int rank, int world,
                                        const std::vector<uint64_t>& weights = {});
// Element counts of every rank's piece of a unit of `size` elements.
std::vector<size_t> PieceCounts(size_t size, int world, const std::vector<uint64_t>& weights = {});
// The hierarchical partition: piece `node` (of `nodes`) of chunk `local` (of
// `locals`) of every unit.
std::vector<ShardPiece> ComputeHierarchicalShardMap(const std::vector<Unit>& units, int local, int locals, int node,
                                                    int nodes);

class CommWorker;

class ZeroOptimizer final : public model::ParamProvider {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroOptimizer>> Create(ZeroOptions options);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // ParamProvider (see param_provider.h for the call pattern).
  const float* AcquireParams(int unit) override;
  void ReleaseParams(int unit) override;
  float* AcquireGrads(int unit) override;
  void ReleaseGrads(int unit) override;
  void Prefetch(int unit) override;

  // Every rank passes the same full vector; each keeps what its stage keeps.
  // Resets gradients, optimizer moments and the step count.
  absl::Status InitFromFull(const float* full);
  // Collective (all ranks call): the full (fp32 master) parameter vector
  // into out[Psi].
  absl::Status GatherFull(float* out);
  void ZeroGrads();
  // Collective: sum gradients across ranks (stage 0/1), clip by the global
  // norm when max_grad_norm > 0, AdamW on the owned range, re-gather params
  // (stage 1/2).
  absl::StatusOr<StepResult> Step(float lr, float max_grad_norm);
  // Waits for all collectives the optimizer has in flight.
  absl::Status Drain();

  // Stage 3: gather all parameters once into a full buffer for a rollout;
  // AcquireParams and inference_view() serve it until EndInference.
  // Other stages: no-ops (the full parameters are resident). bf16: every
  // stage widens the full compute copy into that buffer (stage 3 gathers
  // it in bf16 first), so rollouts see the weights training computes with.
  absl::Status BeginInference();
  void EndInference();
  // A read-only provider over the full parameters (valid for stages 0-2
  // always - bf16 outside BeginInference: widened per unit -, for stage 3
  // between BeginInference and EndInference).
  model::ParamProvider& inference_view();

  // Checkpoint access: this rank's shard of params (the fp32 masters in
  // both precisions) / m / v / grads, in shard_map() order (shard_size()
  // elements each).
  const std::vector<ShardPiece>& shard_map() const { return shard_map_; }
  size_t shard_size() const { return shard_size_; }
  void CopyParamShard(float* out) const;
  // Stage 3 fills its shard; stages 0-2 write their pieces into the full
  // parameters - then every rank calls AllgatherParams() to rebuild them.
  // bf16: the masters' pieces are loaded; AllgatherParams() rebuilds the
  // full masters (stage 0) and the compute copy (stages 0-2; stage 3
  // converts its shard here).
  void LoadParamShard(const float* in);
  absl::Status AllgatherParams();  // collective; no-op for stage 3
  void CopyOptimizerShard(float* m_out, float* v_out) const;
  // Int4 gradients with error feedback: the gradient mass the ranks still
  // owe (the sum over ranks of their quantisation errors) as this rank's
  // shard, in shard_map() order - so it reshards like the moments.
  // Collective (all ranks call). Load puts a shard of it into this rank's
  // error buffer (the other positions start at zero), which keeps the sum.
  bool has_grad_error() const { return !grad_error_.empty(); }
  absl::Status CopyGradErrorShard(float* out);
  void LoadGradErrorShard(const float* in);
  void LoadOptimizerShard(const float* m_in, const float* v_in);
  // Stage 0 keeps full moments on every rank: after every rank loaded its
  // shard, this collective rebuilds them everywhere. No-op for stages 1-3;
  // FailedPrecondition while the moments are offloaded.
  absl::Status AllgatherOptimizerState();
  // Stage 0 only (every rank holds the whole state): copies the full
  // parameters and moments into params[Psi], m[Psi], v[Psi] without any
  // collective (degraded continuation hands them to the next generation).
  // FailedPrecondition for stages 1-3.
  absl::Status CopyFullState(float* params, float* m, float* v) const;
  // The full fp32 parameters into params[Psi] without any collective, where
  // every rank holds them (stages 0-2 in fp32, stage 0 in bf16);
  // FailedPrecondition where the masters are sharded.
  absl::Status CopyResidentParams(float* params) const;
  int64_t step_count() const { return step_; }
  // Stages 1-2: the last Step updated this rank's pieces but failed to
  // allgather them, so the full parameters mix two steps.
  bool step_incomplete() const { return step_incomplete_; }
  void set_step_count(int64_t step) { step_ = step; }
  // Host offload of the optimizer moments (for a rollout): Offload downloads
  // m and v into host vectors and frees their device arrays; Restore
  // allocates them again (ResourceExhausted when that fails; the state stays
  // offloaded) and uploads. Step fails with FailedPrecondition while
  // offloaded; checkpoint access (Copy/LoadOptimizerShard, CopyFullState,
  // InitFromFull) works on the host copies. No-ops when already there.
  absl::Status OffloadOptimizerState();
  absl::Status RestoreOptimizerState();
  bool optimizer_offloaded() const { return offloaded_; }

  // ZenFlow (see the header comment).
  bool has_zenflow() const { return zenflow_ != nullptr; }
  // nullptr without ZenFlow.
  const ZenFlowStats* zenflow_stats() const { return zenflow_ ? &zenflow_->stats() : nullptr; }
  // Collective at stages 1-2 (all ranks call): waits for the host update in
  // flight, applies it, re-gathers the parameters and completes the moments.
  // No-op without ZenFlow.
  absl::Status SyncHostUpdates();
  // The accumulated gradient and the selection (1 / 0 per element) as this
  // rank's shard, in shard_map() order (shard_size() floats each); call
  // after SyncHostUpdates.
  void CopyZenFlowShard(float* acc, float* important) const;
  // Restores them from the full (Psi) arrays of a checkpoint; call after
  // the parameters, moments and the step count are loaded.
  void LoadZenFlowState(const float* acc_full, const float* important_full);

  MemoryReport memory() const;
  // Where the buffers live (options.memory, or the owned host memory).
  kernels::DeviceMemory* device_memory() const { return mem_; }
  absl::Status status() const { return status_; }
  int stage() const { return options_.stage; }
  Precision precision() const { return options_.precision; }
  size_t num_params() const { return psi_; }
  // Trainable elements (num_params() when nothing is frozen).
  size_t num_trainable() const { return frozen_ ? t_psi_ : psi_; }
  bool has_frozen() const { return frozen_; }
  const std::vector<Unit>& units() const { return options_.units; }
  const std::vector<uint64_t>& partition_weights() const { return options_.partition_weights; }

 private:
  class InferenceView;
  struct Gather;   // stage 3 gathered unit
  struct GradBuf;  // stage 2/3 unit gradient buffer

  explicit ZeroOptimizer(ZeroOptions options);
  // Allocates the persistent state (Create); ResourceExhausted on failure.
  absl::Status AllocateState();
  // ResourceExhausted naming `what` and the byte count.
  absl::Status AllocError(const char* what, size_t bytes) const;
  // Internal when the DeviceMemory recorded an error, else OK.
  absl::Status MemoryStatus() const;
  kernels::Ops* comm_ops() const { return options_.comm_ops != nullptr ? options_.comm_ops : options_.ops; }
  size_t opt_size() const {
    if (frozen_) return options_.stage == 0 ? t_psi_ : t_shard_size_;
    return options_.stage == 0 ? psi_ : shard_size_;
  }
  // Offset of piece p in the moment vectors (full at stage 0, else shard).
  size_t OptOffset(const ShardPiece& p) const {
    return options_.stage == 0 ? options_.units[p.unit].offset + p.unit_offset : p.shard_offset;
  }
  // Frozen parameters: one trainable range of a unit.
  struct TrainRange {
    int unit = 0;
    size_t unit_offset = 0;  // in the unit
    size_t size = 0;
    size_t global = 0;        // in the compact vector of all T trainable elements
    size_t shard = 0;         // in this rank's compact trainable shard (my ranges)
    size_t shard_offset = 0;  // in this rank's parameter shard (my ranges)
  };
  // Builds the compact tables from options_.trainable (constructor).
  void BuildTrainable();
  size_t TrainOpt(const TrainRange& r) const { return options_.stage == 0 ? r.global : r.shard; }
  // Where the master of a range lives (my ranges; all ranges at stage 0).
  float* MasterAt(const TrainRange& r) {
    return master_sharded() ? param_shard_.data() + r.shard_offset
                            : params_full_.data() + options_.units[r.unit].offset + r.unit_offset;
  }
  // Step's norm and AdamW over the compact gradients.
  absl::Status FrozenStepUpdate(float lr, float max_grad_norm, StepResult* result);
  // Allgathers the fp32 master shard into dst[Psi] (device), unit by unit.
  absl::Status GatherMasters(float* dst);
  void Fail(const absl::Status& s);
  const float* FullParams() const;
  bool bf16() const { return options_.precision == Precision::kBf16; }
  // Where the fp32 masters live: the shard (stage 3; bf16 stages 1-3) or
  // the full vector.
  bool master_sharded() const { return options_.stage == 3 || (bf16() && options_.stage >= 1); }
  float* MasterPiece(const ShardPiece& p);
  const float* MasterPiece(const ShardPiece& p) const;
  // bf16 packed allgather of one unit: rank r's counts[r] bf16 values travel
  // as ceil(counts[r] / 2) floats. Packed layout offsets, in floats.
  std::vector<size_t> PackedCounts(int unit) const;
  // bf16 packed gathers need max_unit / 2 + one padding float per piece;
  // qwZ the largest int8 gather (with bf16 also the bf16 rounding scratch).
  size_t packed_floats() const {
    const size_t bf16_floats = max_unit_ / 2 + world_ + 1;
    if (!qwz()) return bf16_floats;
    return bf16() ? std::max(qw_packed_floats_, bf16_floats) : qw_packed_floats_;
  }
  float* TakePacked();  // nullptr when allocation fails
  // Widens a packed gathered unit into dst (unit order, fp32).
  void UnpackWiden(int unit, const float* packed, float* dst);
  // Unpacks a packed gathered unit into the bf16 vector dst (unit order).
  void UnpackBf16(int unit, const float* packed, uint16_t* dst) const;
  // Stages 0-2, bf16: rebuilds the full compute copy from the masters
  // (stage 0 locally; stages 1-2 by converting the owned pieces and
  // allgathering them in bf16). Collective for stages 1-2 with N > 1.
  absl::Status RefreshComputeFull();
  // Stage 3 bf16: compute shard = bf16(master shard).
  void RefreshComputeShard();
  std::vector<size_t> UnitCounts(int unit) const;
  // Piece of `unit` owned by this rank.
  const ShardPiece& MyPiece(int unit) const { return shard_map_[unit]; }
  float* TakeBuffer();  // unit-sized gather buffer; nullptr when out of memory
  void ReturnBuffer(float* buf);
  // nullptr (status() set) when a buffer cannot be allocated.
  std::shared_ptr<Gather> StartGather(int unit);
  // Returns a unit's buffers to the free lists and forgets it.
  void ReleaseGather(std::map<int, std::shared_ptr<Gather>>::iterator it);
  absl::Status AllreduceNormSquared(double* sum_sq);
  bool int4_grads() const { return options_.grad_compression == GradCompression::kInt4 && world_ > 1; }
  // reduce_on_release in effect (see ZeroOptions).
  bool unit_reduce() const { return options_.reduce_on_release && options_.stage <= 1 && world_ > 1 && !int4_grads(); }
  // Stages 0-1 with unit_reduce(): allreduces the units not reduced yet
  // this step (all of them in one call when none was) and clears the marks.
  absl::Status ReduceRemainingUnits();
  // ---- hpZ / qwZ (zero_hierarchical.cc)
  bool hpz() const { return options_.hierarchical_partition; }
  bool qwz() const { return options_.weight_quantization == WeightQuantization::kInt8; }
  // Checks the options and sets locals_/nodes_/local_/node_ (Create).
  absl::Status CheckHierarchical();
  // Sizes and allocates the secondary copy and the chunk buffer.
  absl::Status AllocateHierarchicalState();
  std::vector<size_t> ChunkCounts(int unit) const;       // unit -> L chunks
  std::vector<size_t> SubCounts(int unit, int l) const;  // chunk l -> M pieces
  size_t ChunkOffset(int unit, int l) const;
  // Fills the secondary copy from the full vector (InitFromFull; local).
  void FillSecondary(const float* full_host);
  // Collective: rebuilds the secondary copy from the owners' pieces.
  absl::Status RefreshSecondary();
  // Comm thread: starts-to-end gather of one unit into dst (fp32, unit
  // order) for the forward/backward (hpZ and/or qwZ); `packed` is a packed
  // buffer for qwZ.
  absl::Status GatherUnitForCompute(int unit, float* dst, float* packed, int64_t step);
  // The int8 rounding seed of `owner`'s piece of `unit` at `step`.
  uint64_t QuantSeed(int64_t step, int unit, int owner) const;
  // Comm thread: the exact fp32 unit (hpZ: inter then intra allgather).
  absl::Status GatherUnitExact(int unit, float* dst);
  // Comm thread, hpZ: reduce-scatters the unit gradient `in` to this rank's
  // summed piece in `piece`.
  absl::Status HierarchicalReduceScatter(int unit, const float* in, float* piece);
  // Floats one encoded piece of n values takes in gathers and in the
  // secondary copy: the int8 wire (qwZ), packed bf16 (bf16 without qwZ:
  // ceil(n / 2)), or n (fp32).
  size_t WireFloats(size_t n) const;
  std::vector<size_t> WireCounts(const std::vector<size_t>& counts) const;
  // Wire floats of unit `unit` for rank r of the flat gather (qwZ), or for
  // chunk l (hpZ: the chunk's M pieces, each encoded on its own).
  std::vector<size_t> FlatWireCounts(int unit) const;
  std::vector<size_t> ChunkWireCounts(int unit) const;
  size_t ChunkWireFloats(int unit, int l) const;
  // Stages 0-1: sums grads_full_ over ranks (fp32 allreduce or int4).
  absl::Status ReduceFullGrads();
  // Int4 state (Create, when int4_grads()): exchange, staging, errors.
  absl::Status AllocateInt4State();
  // Comm thread, stages 2-3 int4: reduce-scatters the unit gradient `in`
  // (device) and leaves this rank's summed piece in `piece` (device).
  absl::Status Int4ReduceScatter(int unit, const float* in, float* piece);

  ZeroOptions options_;
  // Owned when options.memory was nullptr; declared before every array so
  // it is destroyed after them.
  std::unique_ptr<kernels::DeviceMemory> owned_memory_;
  kernels::DeviceMemory* mem_ = nullptr;
  size_t psi_ = 0;
  size_t max_unit_ = 0;
  int rank_ = 0;
  int world_ = 1;
  std::vector<ShardPiece> shard_map_;
  size_t shard_size_ = 0;

  // Device arrays (see the storage table in the header comment).
  kernels::DeviceArray<float> params_full_;       // stage 0-2 (bf16: stage 0)
  kernels::DeviceArray<float> param_shard_;       // stage 3 (bf16: stages 1-3)
  kernels::DeviceArray<float> grads_full_;        // stage 0-1
  kernels::DeviceArray<float> grad_shard_;        // stage 2-3
  kernels::DeviceArray<float> m_, v_;             // full (stage 0) or shard
  kernels::DeviceArray<float> infer_full_;        // during inference (see above)
  kernels::DeviceArray<uint16_t> compute_full_;   // bf16 stages 0-2
  kernels::DeviceArray<uint16_t> compute_shard_;  // bf16 stage 3
  kernels::DeviceArray<float> norm_buf_;          // 2 floats: norm allreduce
  // Host copies of m and v while offloaded.
  std::vector<float> m_host_, v_host_;
  bool in_inference_ = false;
  int64_t step_ = 0;
  bool step_incomplete_ = false;
  bool offloaded_ = false;

  // Unit-sized gather buffers (stage 3; bf16 stages 0-2 widen into them)
  // and their free list; job thread only.
  std::vector<kernels::DeviceArray<float>> gather_bufs_;
  std::vector<float*> free_gather_;
  // bf16 stage 3: packed gather buffers and their free list; one more for
  // the compute-copy allgather of stages 1-2 (pack_buf_).
  std::vector<kernels::DeviceArray<float>> packed_bufs_;
  std::vector<float*> free_packed_;
  kernels::DeviceArray<float> pack_buf_;
  std::map<int, std::shared_ptr<Gather>> gathered_;
  // Stage 2/3 gradient buffers; the comm thread returns them.
  std::vector<std::shared_ptr<GradBuf>> grad_bufs_;
  std::map<int, std::shared_ptr<GradBuf>> grads_open_;
  kernels::DeviceArray<float> rs_piece_;  // comm thread: reduce-scatter output

  // Int4 gradients (comm thread, host memory): the exchange and its
  // staging buffers, and the error-feedback buffers (grad_error_: Psi, by
  // parameter; owner_error_: the shard, stages 0-1).
  std::unique_ptr<comm::QuantizedExchange> qx_;
  std::vector<float> q_in_, q_out_;
  std::vector<float> grad_error_, owner_error_;

  // Frozen parameters (see the header comment): all trainable ranges by
  // unit, this rank's, the compact unit offsets, and per unit the trainable
  // element count of every rank's piece.
  bool frozen_ = false;
  size_t t_psi_ = 0, t_shard_size_ = 0;
  std::vector<std::vector<TrainRange>> all_ranges_, my_ranges_;
  std::vector<size_t> t_unit_offset_;
  std::vector<std::vector<size_t>> t_counts_;
  // unit_reduce(): open AcquireGrads per unit, and the units whose
  // allreduce was submitted this step (job thread only).
  std::vector<int> full_grad_refs_;
  std::vector<char> unit_reduced_;
  // hpZ: nodes_ x locals_ ranks; this rank is (node_, local_).
  int locals_ = 1, nodes_ = 1, local_ = 0, node_ = 0;
  // hpZ secondary copy: chunk local_ of every unit (fp32; qwZ: its wire),
  // at secondary_off_[unit].
  kernels::DeviceArray<float> secondary_;
  std::vector<size_t> secondary_off_;
  std::vector<size_t> chunk_off_;  // prefix sums of the fp32 chunk sizes
  // hpZ: one chunk (comm thread and, after Drain, exact gathers).
  kernels::DeviceArray<float> chunk_buf_;
  size_t qw_packed_floats_ = 0;  // qwZ: the largest packed gather

  // ZenFlow (zero_zenflow.cc): the split update, and its device view.
  std::unique_ptr<ZenFlow> zenflow_;
  absl::Status CreateZenFlow();
  ZenFlowDevice ZenFlowView();

  std::unique_ptr<CommWorker> worker_;
  absl::Status status_;
  std::unique_ptr<InferenceView> view_;
};

}  // namespace tandem::zero
