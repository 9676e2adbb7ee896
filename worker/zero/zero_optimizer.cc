// ZeroOptimizer: construction, partition, state allocation, stage-3
// parameter gathers, bf16 compute copy, init / export / inference.
#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/zero/zero_internal.h"

namespace tandem::zero {

class ZeroOptimizer::InferenceView final : public model::ParamProvider {
 public:
  explicit InferenceView(ZeroOptimizer* owner) : owner_(owner) {}
  const float* AcquireParams(int unit) override {
    // bf16 stages 0-2 outside BeginInference: widen per unit like training.
    if (Delegates()) return owner_->AcquireParams(unit);
    return owner_->FullParams() + owner_->options_.units[unit].offset;
  }
  void ReleaseParams(int unit) override {
    if (Delegates()) owner_->ReleaseParams(unit);
  }
  float* AcquireGrads(int) override { return nullptr; }  // read-only view
  void ReleaseGrads(int) override {}

 private:
  bool Delegates() const { return owner_->bf16() && owner_->options_.stage < 3 && !owner_->in_inference_; }
  ZeroOptimizer* owner_;
};

absl::StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name.empty() || name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("precision \"", std::string(name), "\" (expected fp32 or bf16)"));
}

std::vector<size_t> PieceCounts(size_t size, int world, const std::vector<uint64_t>& weights) {
  if (weights.empty()) return comm::SplitEven(size, world);
  return comm::SplitWeighted(size, weights);
}

std::vector<ShardPiece> ComputeShardMap(const std::vector<Unit>& units, int rank, int world,
                                        const std::vector<uint64_t>& weights) {
  std::vector<ShardPiece> map;
  size_t shard_offset = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (weights.empty()) {
      const size_t base = units[u].size / world, extra = units[u].size % world;
      const size_t size = base + (static_cast<size_t>(rank) < extra ? 1 : 0);
      const size_t offset = base * rank + std::min<size_t>(static_cast<size_t>(rank), extra);
      map.push_back(ShardPiece{static_cast<int>(u), offset, size, shard_offset});
      shard_offset += size;
      continue;
    }
    const std::vector<size_t> counts = comm::SplitWeighted(units[u].size, weights);
    size_t offset = 0;
    for (int r = 0; r < rank; ++r) offset += counts[r];
    map.push_back(ShardPiece{static_cast<int>(u), offset, counts[rank], shard_offset});
    shard_offset += counts[rank];
  }
  return map;
}

absl::StatusOr<std::unique_ptr<ZeroOptimizer>> ZeroOptimizer::Create(ZeroOptions options) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero: stage ", options.stage, " (expected 0-3)"));
  }
  if (options.comm == nullptr || options.ops == nullptr) {
    return absl::InvalidArgumentError("zero: comm and ops are required");
  }
  if (options.units.empty()) {
    return absl::InvalidArgumentError("zero: empty unit table");
  }
  size_t expect = 0;
  for (size_t u = 0; u < options.units.size(); ++u) {
    if (options.units[u].offset != expect) {
      return absl::InvalidArgumentError(absl::StrCat("zero: unit ", u, " starts at ", options.units[u].offset,
                                                     ", expected ", expect, " (units must be contiguous, in order)"));
    }
    expect += options.units[u].size;
  }
  RETURN_IF_ERROR(CheckTrainable(options));
  RETURN_IF_ERROR(CheckPartitionWeights(options));
  auto z = std::unique_ptr<ZeroOptimizer>(new ZeroOptimizer(std::move(options)));
  if (absl::Status s = z->CheckHierarchical(); !s.ok()) return s;
  if (absl::Status s = z->AllocateState(); !s.ok()) return s;
  if (absl::Status s = z->CreateZenFlow(); !s.ok()) return s;
  return z;
}

absl::Status CheckPartitionWeights(const ZeroOptions& options) {
  const auto& w = options.partition_weights;
  if (w.empty()) return absl::OkStatus();
  const int world = options.comm->size();
  if (static_cast<int>(w.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero: ", w.size(), " partition weights for a world of ", world, " ranks"));
  }
  for (size_t r = 0; r < w.size(); ++r) {
    if (w[r] == 0) return absl::InvalidArgumentError(absl::StrCat("zero: partition weight of rank ", r, " is 0"));
  }
  if (options.hierarchical_partition) {
    return absl::InvalidArgumentError("zero: speed-proportional partitions do not combine with hpZ");
  }
  if (options.weight_quantization != WeightQuantization::kNone) {
    return absl::InvalidArgumentError("zero: speed-proportional partitions do not combine with int8 weight gathers");
  }
  if (options.grad_compression != GradCompression::kNone && world > 1) {
    return absl::InvalidArgumentError("zero: speed-proportional partitions do not combine with int4 gradients");
  }
  return absl::OkStatus();
}

ZeroOptimizer::ZeroOptimizer(ZeroOptions options) : options_(std::move(options)) {
  if (options_.memory == nullptr) {
    owned_memory_ = kernels::MakeHostMemory();
    options_.memory = owned_memory_.get();
  }
  mem_ = options_.memory;
  rank_ = options_.comm->rank();
  world_ = options_.comm->size();
  for (const auto& u : options_.units) {
    psi_ += u.size;
    max_unit_ = std::max(max_unit_, u.size);
  }
  if (hpz() && options_.intra != nullptr && options_.inter != nullptr &&
      options_.intra->size() * options_.inter->size() == world_) {
    locals_ = options_.intra->size();
    nodes_ = options_.inter->size();
    local_ = options_.intra->rank();
    node_ = options_.inter->rank();
    shard_map_ = ComputeHierarchicalShardMap(options_.units, local_, locals_, node_, nodes_);
  } else {
    shard_map_ = ComputeShardMap(options_.units, rank_, world_, options_.partition_weights);
  }
  for (const auto& p : shard_map_) shard_size_ += p.size;
  BuildTrainable();
  full_grad_refs_.assign(options_.units.size(), 0);
  unit_reduced_.assign(options_.units.size(), 0);
  worker_ = std::make_unique<CommWorker>();
  view_ = std::make_unique<InferenceView>(this);
}

absl::Status ZeroOptimizer::AllocError(const char* what, size_t bytes) const {
  const std::string detail = mem_->last_error();
  return absl::ResourceExhaustedError(absl::StrCat("zero: out of ", mem_->name(), " memory allocating ", what, " (",
                                                   bytes, " bytes; ", mem_->allocated_bytes(), " bytes allocated)",
                                                   detail.empty() ? "" : ": ", detail));
}

absl::Status ZeroOptimizer::MemoryStatus() const {
  if (mem_->ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("zero: device memory error: ", mem_->last_error()));
}

absl::Status ZeroOptimizer::AllocateState() {
  // Zero-filled, as the state starts (InitFromFull overwrites the params).
  struct Want {
    kernels::DeviceArray<float>* f32;
    kernels::DeviceArray<uint16_t>* b16;
    size_t n;
    const char* what;
  };
  const int stage = options_.stage;
  std::vector<Want> wants;
  if (master_sharded()) {
    wants.push_back({&param_shard_, nullptr, shard_size_, "the parameter shard"});
  } else {
    wants.push_back({&params_full_, nullptr, psi_, "the full parameters"});
  }
  if (bf16() && stage <= 2) {
    wants.push_back({nullptr, &compute_full_, psi_, "the bf16 compute copy"});
  }
  if (bf16() && stage == 3) {
    wants.push_back({nullptr, &compute_shard_, shard_size_, "the bf16 compute shard"});
  }
  if (bf16() && (stage == 1 || stage == 2) && world_ > 1) {
    wants.push_back({&pack_buf_, nullptr, packed_floats(), "the bf16 pack buffer"});
  }
  // Frozen parameters: gradients of the trainable elements only.
  if (stage <= 1) wants.push_back({&grads_full_, nullptr, frozen_ ? t_psi_ : psi_, "the full gradients"});
  if (stage >= 2) {
    wants.push_back({&grad_shard_, nullptr, frozen_ ? t_shard_size_ : shard_size_, "the gradient shard"});
    // This rank's largest piece (the even split: ceil(max_unit / N)).
    size_t largest_piece = (max_unit_ + world_ - 1) / world_;
    if (!options_.partition_weights.empty()) {
      largest_piece = 1;
      for (const ShardPiece& p : shard_map_) largest_piece = std::max(largest_piece, p.size);
    }
    wants.push_back({&rs_piece_, nullptr, largest_piece, "the reduce-scatter buffer"});
  }
  if (stage >= 1 && world_ > 1) {
    wants.push_back({&norm_buf_, nullptr, 2, "the norm buffer"});
  }
  wants.push_back({&m_, nullptr, opt_size(), "the first moments"});
  wants.push_back({&v_, nullptr, opt_size(), "the second moments"});
  for (const Want& w : wants) {
    const bool ok = w.f32 != nullptr ? w.f32->AllocateZeroed(mem_, w.n) : w.b16->AllocateZeroed(mem_, w.n);
    if (!ok) {
      return AllocError(w.what, w.n * (w.f32 != nullptr ? sizeof(float) : sizeof(uint16_t)));
    }
  }
  RETURN_IF_ERROR(AllocateHierarchicalState());
  if (int4_grads()) RETURN_IF_ERROR(AllocateInt4State());
  return MemoryStatus();
}

ZeroOptimizer::~ZeroOptimizer() {
  if (worker_) worker_->Drain().IgnoreError();
  worker_.reset();  // joins before the buffers go
}

void ZeroOptimizer::Fail(const absl::Status& s) {
  if (status_.ok() && !s.ok()) status_ = s;
}

const float* ZeroOptimizer::FullParams() const {
  if (in_inference_) return infer_full_.data();
  if (options_.stage == 3 || bf16()) return nullptr;
  return params_full_.data();
}

float* ZeroOptimizer::MasterPiece(const ShardPiece& p) {
  return master_sharded() ? param_shard_.data() + p.shard_offset
                          : params_full_.data() + options_.units[p.unit].offset + p.unit_offset;
}

const float* ZeroOptimizer::MasterPiece(const ShardPiece& p) const {
  return const_cast<ZeroOptimizer*>(this)->MasterPiece(p);
}

std::vector<size_t> ZeroOptimizer::PackedCounts(int unit) const {
  std::vector<size_t> counts = UnitCounts(unit);
  for (size_t& c : counts) c = (c + 1) / 2;
  return counts;
}

float* ZeroOptimizer::TakePacked() {
  if (!free_packed_.empty()) {
    float* b = free_packed_.back();
    free_packed_.pop_back();
    return b;
  }
  kernels::DeviceArray<float> buf;
  if (!buf.Allocate(mem_, packed_floats())) {
    Fail(AllocError("a packed bf16 gather buffer", packed_floats() * sizeof(float)));
    return nullptr;
  }
  packed_bufs_.push_back(std::move(buf));
  return packed_bufs_.back().data();
}

void ZeroOptimizer::UnpackWiden(int unit, const float* packed, float* dst) {
  const std::vector<size_t> counts = UnitCounts(unit);
  size_t in = 0, out = 0;  // packed floats, unit elements
  for (size_t c : counts) {
    options_.ops->bf16_to_float(reinterpret_cast<const uint16_t*>(packed + in), dst + out, c);
    in += (c + 1) / 2;
    out += c;
  }
}

void ZeroOptimizer::UnpackBf16(int unit, const float* packed, uint16_t* dst) const {
  const std::vector<size_t> counts = UnitCounts(unit);
  size_t in = 0, out = 0;
  for (size_t c : counts) {
    mem_->CopyOnDevice(dst + out, packed + in, c * sizeof(uint16_t));
    in += (c + 1) / 2;
    out += c;
  }
}

void ZeroOptimizer::RefreshComputeShard() {
  options_.ops->float_to_bf16(param_shard_.data(), compute_shard_.data(), shard_size_);
}

absl::Status ZeroOptimizer::RefreshComputeFull() {
  kernels::Ops* ops = options_.ops;
  if (options_.stage == 0 || world_ == 1) {
    // The masters are full (stage 0) or the shard is everything (N = 1).
    const float* master = options_.stage == 0 ? params_full_.data() : param_shard_.data();
    ops->float_to_bf16(master, compute_full_.data(), psi_);
    return absl::OkStatus();
  }
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const int unit = static_cast<int>(u);
    const std::vector<size_t> counts = PackedCounts(unit);
    size_t mine = 0;
    for (int r = 0; r < rank_; ++r) mine += counts[r];
    const ShardPiece& piece = shard_map_[u];
    float* packed = pack_buf_.data();
    uint16_t* slot = reinterpret_cast<uint16_t*>(packed + mine);
    ops->float_to_bf16(param_shard_.data() + piece.shard_offset, slot, piece.size);
    // Padding travels as zeros.
    if (piece.size % 2) mem_->SetZero(slot + piece.size, sizeof(uint16_t));
    absl::Status s = worker_->Run([&] { return comm->allgather(packed + mine, packed, counts, timeout); });
    if (!s.ok()) return s;
    UnpackBf16(unit, packed, compute_full_.data() + options_.units[u].offset);
  }
  return MemoryStatus();
}

std::vector<size_t> ZeroOptimizer::UnitCounts(int unit) const {
  return PieceCounts(options_.units[unit].size, world_, options_.partition_weights);
}

// ---- stage 3 parameter gathering -------------------------------------------

float* ZeroOptimizer::TakeBuffer() {
  if (!free_gather_.empty()) {
    float* b = free_gather_.back();
    free_gather_.pop_back();
    return b;
  }
  const size_t n = std::max<size_t>(max_unit_, 1);
  kernels::DeviceArray<float> buf;
  if (!buf.Allocate(mem_, n)) {
    Fail(AllocError("a unit gather buffer", n * sizeof(float)));
    return nullptr;
  }
  gather_bufs_.push_back(std::move(buf));
  return gather_bufs_.back().data();
}

void ZeroOptimizer::ReturnBuffer(float* buf) {
  if (buf != nullptr) free_gather_.push_back(buf);
}

std::shared_ptr<ZeroOptimizer::Gather> ZeroOptimizer::StartGather(int unit) {
  auto g = std::make_shared<Gather>();
  g->unit = unit;
  g->buf = TakeBuffer();
  if (g->buf == nullptr) return nullptr;
  // bf16 stages 0-2: the compute copy is resident; AcquireParams widens it.
  if (options_.stage < 3) {
    gathered_[unit] = g;
    return g;
  }
  if (hpz() || qwz()) {
    if (qwz() || bf16()) {  // the encoded pieces arrive there
      g->packed = TakePacked();
      if (g->packed == nullptr) {
        ReturnBuffer(g->buf);
        return nullptr;
      }
    }
    float* dst = g->buf;
    float* packed = g->packed;
    const int64_t step = step_;
    g->task = worker_->Submit([=, this] { return GatherUnitForCompute(unit, dst, packed, step); });
    gathered_[unit] = g;
    return g;
  }
  const ShardPiece piece = MyPiece(unit);
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  if (bf16()) {
    // The unit's bf16 pieces travel packed (half the bytes of fp32); my
    // piece is copied into its slot and gathered in place.
    g->packed = TakePacked();
    if (g->packed == nullptr) {
      ReturnBuffer(g->buf);
      return nullptr;
    }
    const std::vector<size_t> counts = PackedCounts(unit);
    size_t mine = 0;
    for (int r = 0; r < rank_; ++r) mine += counts[r];
    uint16_t* slot = reinterpret_cast<uint16_t*>(g->packed + mine);
    mem_->CopyOnDevice(slot, compute_shard_.data() + piece.shard_offset, piece.size * sizeof(uint16_t));
    // Padding travels as zeros.
    if (piece.size % 2) mem_->SetZero(slot + piece.size, sizeof(uint16_t));
    float* packed = g->packed;
    g->task = worker_->Submit([=] { return comm->allgather(packed + mine, packed, counts, timeout); });
    gathered_[unit] = g;
    return g;
  }
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* src = param_shard_.data() + piece.shard_offset;
  float* dst = g->buf;
  g->task = worker_->Submit([=] { return comm->allgather(src, dst, counts, timeout); });
  gathered_[unit] = g;
  return g;
}

void ZeroOptimizer::ReleaseGather(std::map<int, std::shared_ptr<Gather>>::iterator it) {
  ReturnBuffer(it->second->buf);
  if (it->second->packed != nullptr) free_packed_.push_back(it->second->packed);
  gathered_.erase(it);
}

const float* ZeroOptimizer::AcquireParams(int unit) {
  const Unit& u = options_.units[unit];
  if (in_inference_) return infer_full_.data() + u.offset;
  if (options_.stage < 3 && !bf16()) return params_full_.data() + u.offset;
  auto it = gathered_.find(unit);
  std::shared_ptr<Gather> g = it != gathered_.end() ? it->second : StartGather(unit);
  if (g == nullptr) return nullptr;  // out of memory: status() says so
  if (g->refs == 0) {
    if (g->task) Fail(worker_->Wait(g->task));
    if (bf16() && options_.stage < 3) {
      options_.ops->bf16_to_float(compute_full_.data() + u.offset, g->buf, u.size);
    } else if (bf16() && !hpz() && !qwz()) {
      UnpackWiden(unit, g->packed, g->buf);  // hpZ / qwZ: the gather decoded it
    }
  }
  ++g->refs;
  return g->buf;
}

void ZeroOptimizer::ReleaseParams(int unit) {
  if (in_inference_ || (options_.stage < 3 && !bf16())) return;
  auto it = gathered_.find(unit);
  if (it == gathered_.end()) return;
  if (--it->second->refs > 0) return;
  ReleaseGather(it);
}

void ZeroOptimizer::Prefetch(int unit) {
  if (options_.stage < 3 || in_inference_) return;
  if (unit < 0 || unit >= static_cast<int>(options_.units.size())) return;
  if (gathered_.count(unit)) return;
  if (free_gather_.empty() && gather_bufs_.size() >= kMaxGatherBuffers) return;
  StartGather(unit);
}

// ---- init / export / inference ----------------------------------------------

absl::Status ZeroOptimizer::InitFromFull(const float* full) {
  if (absl::Status s = Drain(); !s.ok()) return s;
  if (!master_sharded()) {
    params_full_.Upload(full, psi_);
  } else {
    for (const auto& p : shard_map_) {
      param_shard_.Upload(full + options_.units[p.unit].offset + p.unit_offset, p.size, p.shard_offset);
    }
  }
  // Every rank converts the same full vector: the same bits everywhere.
  if (bf16() && options_.stage == 0) {
    options_.ops->float_to_bf16(params_full_.data(), compute_full_.data(), psi_);
  } else if (bf16() && options_.stage <= 2) {
    // The masters are sharded: convert the full vector unit by unit through
    // a gather buffer.
    float* stage_buf = TakeBuffer();
    if (stage_buf == nullptr) {
      return AllocError("a unit gather buffer", std::max<size_t>(max_unit_, 1) * sizeof(float));
    }
    for (const Unit& u : options_.units) {
      mem_->CopyToDevice(stage_buf, full + u.offset, u.size * sizeof(float));
      options_.ops->float_to_bf16(stage_buf, compute_full_.data() + u.offset, u.size);
    }
    ReturnBuffer(stage_buf);
  }
  if (bf16() && options_.stage == 3) RefreshComputeShard();
  if (hpz()) FillSecondary(full);
  grads_full_.Zero();
  grad_shard_.Zero();
  std::fill(full_grad_refs_.begin(), full_grad_refs_.end(), 0);
  std::fill(unit_reduced_.begin(), unit_reduced_.end(), 0);
  m_.Zero();
  v_.Zero();
  std::fill(m_host_.begin(), m_host_.end(), 0.f);
  std::fill(v_host_.begin(), v_host_.end(), 0.f);
  std::fill(grad_error_.begin(), grad_error_.end(), 0.f);
  std::fill(owner_error_.begin(), owner_error_.end(), 0.f);
  if (zenflow_) zenflow_->Reset();
  step_ = 0;
  return MemoryStatus();
}

absl::Status ZeroOptimizer::GatherMasters(float* dst) {
  for (size_t u = 0; u < options_.units.size(); ++u) {
    float* out = dst + options_.units[u].offset;
    absl::Status s = worker_->Run([&] { return GatherUnitExact(static_cast<int>(u), out); });
    if (!s.ok()) return s;
  }
  return MemoryStatus();
}

absl::Status ZeroOptimizer::GatherFull(float* out) {
  if (absl::Status s = Drain(); !s.ok()) return s;
  if (!master_sharded()) {
    params_full_.Download(out, psi_);
    return MemoryStatus();
  }
  if (in_inference_ && !bf16()) {  // bf16: infer_full_ is the compute copy
    infer_full_.Download(out, psi_);
    return MemoryStatus();
  }
  // Unit by unit through a gather buffer, downloaded as it arrives.
  float* buf = TakeBuffer();
  if (buf == nullptr) {
    return AllocError("a unit gather buffer", std::max<size_t>(max_unit_, 1) * sizeof(float));
  }
  absl::Status s;
  for (size_t u = 0; s.ok() && u < options_.units.size(); ++u) {
    s = worker_->Run([&] { return GatherUnitExact(static_cast<int>(u), buf); });
    if (s.ok()) {
      mem_->CopyToHost(out + options_.units[u].offset, buf, options_.units[u].size * sizeof(float));
    }
  }
  ReturnBuffer(buf);
  if (!s.ok()) return s;
  return MemoryStatus();
}

absl::Status ZeroOptimizer::BeginInference() {
  if (in_inference_ || (options_.stage < 3 && !bf16())) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  // Every element is written below.
  if (!infer_full_.Allocate(mem_, psi_)) {
    return AllocError("the inference copy", psi_ * sizeof(float));
  }
  absl::Status s;
  if (!bf16()) {
    s = GatherMasters(infer_full_.data());
  } else if (options_.stage < 3) {
    // The resident bf16 compute copy, widened once for the whole rollout.
    options_.ops->bf16_to_float(compute_full_.data(), infer_full_.data(), psi_);
  } else if (hpz() || qwz()) {
    // bf16(masters), the flat compute copy: exact gathers, rounded per unit
    // through a packed buffer.
    float* buf = TakeBuffer();
    float* scratch = buf != nullptr ? TakePacked() : nullptr;
    if (scratch == nullptr) s = status_;  // out of memory: status_ says so
    uint16_t* bits = reinterpret_cast<uint16_t*>(scratch);
    for (size_t u = 0; s.ok() && u < options_.units.size(); ++u) {
      s = worker_->Run([&] { return GatherUnitExact(static_cast<int>(u), buf); });
      if (!s.ok()) break;
      options_.ops->float_to_bf16(buf, bits, options_.units[u].size);
      options_.ops->bf16_to_float(bits, infer_full_.data() + options_.units[u].offset, options_.units[u].size);
    }
    ReturnBuffer(buf);
    if (scratch != nullptr) free_packed_.push_back(scratch);
  } else {
    // Gather the bf16 compute shards unit by unit and widen them.
    for (size_t u = 0; s.ok() && u < options_.units.size(); ++u) {
      const int unit = static_cast<int>(u);
      auto g = StartGather(unit);
      if (g == nullptr) {
        s = status_;
        break;
      }
      s = worker_->Wait(g->task);
      if (s.ok()) {
        UnpackWiden(unit, g->packed, infer_full_.data() + options_.units[u].offset);
      }
      ReleaseGather(gathered_.find(unit));
    }
  }
  if (s.ok()) s = MemoryStatus();
  if (!s.ok()) {
    infer_full_.reset();
    return s;
  }
  in_inference_ = true;
  return absl::OkStatus();
}

void ZeroOptimizer::EndInference() {
  if (!in_inference_) return;
  in_inference_ = false;
  infer_full_.reset();  // frees the memory
}

model::ParamProvider& ZeroOptimizer::inference_view() { return *view_; }

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport r;
  r.param_bytes = params_full_.bytes() + param_shard_.bytes();
  r.compute_bytes = compute_full_.bytes() + compute_shard_.bytes() + secondary_.bytes();
  r.secondary_bytes = secondary_.bytes();
  r.grad_bytes = grads_full_.bytes() + grad_shard_.bytes();
  r.optimizer_bytes = m_.bytes() + v_.bytes();
  r.offloaded_bytes = (m_host_.size() + v_host_.size()) * sizeof(float);
  size_t temp = rs_piece_.bytes() + infer_full_.bytes() + pack_buf_.bytes() + norm_buf_.bytes() + chunk_buf_.bytes();
  for (const auto& b : gather_bufs_) temp += b.bytes();
  for (const auto& b : packed_bufs_) temp += b.bytes();
  for (const auto& b : grad_bufs_) temp += b->mem.bytes();
  r.temp_bytes = temp;
  return r;
}

}  // namespace tandem::zero
