#include "worker/zero/zero_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem::zero {

namespace {
constexpr size_t kMaxGatherBuffers = 4;  // stage 3: current, prefetched, unit 0
constexpr size_t kMaxGradBuffers = 3;    // stage 2/3: unit 0, current, in flight
}  // namespace

// Runs submitted collectives on one owned thread, in submission order.
class CommWorker {
 public:
  struct Task {
    std::function<absl::Status()> fn;
    absl::Status status;
    bool done = false;
  };

  CommWorker() : thread_([this] { Loop(); }) {}
  ~CommWorker() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  std::shared_ptr<Task> Submit(std::function<absl::Status()> fn) {
    auto task = std::make_shared<Task>();
    task->fn = std::move(fn);
    absl::MutexLock lock(&mu_);
    queue_.push_back(task);
    return task;
  }

  absl::Status Wait(const std::shared_ptr<Task>& task) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return task->done; };
    mu_.Await(absl::Condition(&done));
    return task->status;
  }

  bool Done(const std::shared_ptr<Task>& task) {
    absl::MutexLock lock(&mu_);
    return task->done;
  }

  absl::Status Run(std::function<absl::Status()> fn) {
    return Wait(Submit(std::move(fn)));
  }

  // Waits until the queue is empty; returns the first error of any task.
  absl::Status Drain() {
    absl::MutexLock lock(&mu_);
    auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queue_.empty() && !running_;
    };
    mu_.Await(absl::Condition(&idle));
    return first_error_;
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return stop_ || !queue_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stop_ and nothing left
        task = queue_.front();
        queue_.pop_front();
        running_ = true;
      }
      absl::Status s = task->fn();
      absl::MutexLock lock(&mu_);
      task->status = s;
      task->done = true;
      running_ = false;
      if (!s.ok() && first_error_.ok()) first_error_ = s;
    }
  }

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Task>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the members above exist
};

struct ZeroOptimizer::Gather {
  int unit = 0;
  float* buf = nullptr;     // what the model reads (fp32, device)
  float* packed = nullptr;  // bf16 stage 3: the packed bf16 allgather target
  std::shared_ptr<CommWorker::Task> task;
  int refs = 0;
};

struct ZeroOptimizer::GradBuf {
  kernels::DeviceArray<float> mem;
  int refs = 0;      // open AcquireGrads on it
  bool open = false;
  std::shared_ptr<CommWorker::Task> task;  // reduce-scatter in flight
};

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
  bool Delegates() const {
    return owner_->bf16() && owner_->options_.stage < 3 &&
           !owner_->in_inference_;
  }
  ZeroOptimizer* owner_;
};

absl::StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name.empty() || name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("precision \"", std::string(name), "\" (expected fp32 or bf16)"));
}

std::vector<ShardPiece> ComputeShardMap(const std::vector<Unit>& units,
                                        int rank, int world) {
  std::vector<ShardPiece> map;
  size_t shard_offset = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const size_t base = units[u].size / world, extra = units[u].size % world;
    const size_t size = base + (static_cast<size_t>(rank) < extra ? 1 : 0);
    const size_t offset =
        base * rank + std::min<size_t>(static_cast<size_t>(rank), extra);
    map.push_back(ShardPiece{static_cast<int>(u), offset, size, shard_offset});
    shard_offset += size;
  }
  return map;
}

absl::StatusOr<std::unique_ptr<ZeroOptimizer>> ZeroOptimizer::Create(
    ZeroOptions options) {
  if (options.stage < 0 || options.stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("zero: stage ", options.stage, " (expected 0-3)"));
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
      return absl::InvalidArgumentError(absl::StrCat(
          "zero: unit ", u, " starts at ", options.units[u].offset,
          ", expected ", expect, " (units must be contiguous, in order)"));
    }
    expect += options.units[u].size;
  }
  auto z = std::unique_ptr<ZeroOptimizer>(new ZeroOptimizer(std::move(options)));
  if (absl::Status s = z->AllocateState(); !s.ok()) return s;
  return z;
}

ZeroOptimizer::ZeroOptimizer(ZeroOptions options)
    : options_(std::move(options)) {
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
  shard_map_ = ComputeShardMap(options_.units, rank_, world_);
  for (const auto& p : shard_map_) shard_size_ += p.size;
  worker_ = std::make_unique<CommWorker>();
  view_ = std::make_unique<InferenceView>(this);
}

absl::Status ZeroOptimizer::AllocError(const char* what, size_t bytes) const {
  const std::string detail = mem_->last_error();
  return absl::ResourceExhaustedError(absl::StrCat(
      "zero: out of ", mem_->name(), " memory allocating ", what, " (", bytes,
      " bytes; ", mem_->allocated_bytes(), " bytes allocated)",
      detail.empty() ? "" : ": ", detail));
}

absl::Status ZeroOptimizer::MemoryStatus() const {
  if (mem_->ok()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("zero: device memory error: ", mem_->last_error()));
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
  if (stage <= 1) wants.push_back({&grads_full_, nullptr, psi_, "the full gradients"});
  if (stage >= 2) {
    wants.push_back({&grad_shard_, nullptr, shard_size_, "the gradient shard"});
    wants.push_back({&rs_piece_, nullptr, (max_unit_ + world_ - 1) / world_,
                     "the reduce-scatter buffer"});
  }
  if (stage >= 1 && world_ > 1) {
    wants.push_back({&norm_buf_, nullptr, 2, "the norm buffer"});
  }
  wants.push_back({&m_, nullptr, opt_size(), "the first moments"});
  wants.push_back({&v_, nullptr, opt_size(), "the second moments"});
  for (const Want& w : wants) {
    const bool ok = w.f32 != nullptr ? w.f32->AllocateZeroed(mem_, w.n)
                                     : w.b16->AllocateZeroed(mem_, w.n);
    if (!ok) {
      return AllocError(w.what, w.n * (w.f32 != nullptr ? sizeof(float)
                                                        : sizeof(uint16_t)));
    }
  }
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
  return master_sharded()
             ? param_shard_.data() + p.shard_offset
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
    options_.ops->bf16_to_float(reinterpret_cast<const uint16_t*>(packed + in),
                                dst + out, c);
    in += (c + 1) / 2;
    out += c;
  }
}

void ZeroOptimizer::UnpackBf16(int unit, const float* packed,
                               uint16_t* dst) const {
  const std::vector<size_t> counts = UnitCounts(unit);
  size_t in = 0, out = 0;
  for (size_t c : counts) {
    mem_->CopyOnDevice(dst + out, packed + in, c * sizeof(uint16_t));
    in += (c + 1) / 2;
    out += c;
  }
}

void ZeroOptimizer::RefreshComputeShard() {
  options_.ops->float_to_bf16(param_shard_.data(), compute_shard_.data(),
                              shard_size_);
}

absl::Status ZeroOptimizer::RefreshComputeFull() {
  kernels::Ops* ops = options_.ops;
  if (options_.stage == 0 || world_ == 1) {
    // The masters are full (stage 0) or the shard is everything (N = 1).
    const float* master =
        options_.stage == 0 ? params_full_.data() : param_shard_.data();
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
    ops->float_to_bf16(param_shard_.data() + piece.shard_offset, slot,
                       piece.size);
    // Padding travels as zeros.
    if (piece.size % 2) mem_->SetZero(slot + piece.size, sizeof(uint16_t));
    absl::Status s = worker_->Run([&] {
      return comm->allgather(packed + mine, packed, counts, timeout);
    });
    if (!s.ok()) return s;
    UnpackBf16(unit, packed, compute_full_.data() + options_.units[u].offset);
  }
  return MemoryStatus();
}

std::vector<size_t> ZeroOptimizer::UnitCounts(int unit) const {
  return comm::SplitEven(options_.units[unit].size, world_);
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
    mem_->CopyOnDevice(slot, compute_shard_.data() + piece.shard_offset,
                       piece.size * sizeof(uint16_t));
    // Padding travels as zeros.
    if (piece.size % 2) mem_->SetZero(slot + piece.size, sizeof(uint16_t));
    float* packed = g->packed;
    g->task = worker_->Submit([=] {
      return comm->allgather(packed + mine, packed, counts, timeout);
    });
    gathered_[unit] = g;
    return g;
  }
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* src = param_shard_.data() + piece.shard_offset;
  float* dst = g->buf;
  g->task = worker_->Submit([=] {
    return comm->allgather(src, dst, counts, timeout);
  });
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
  std::shared_ptr<Gather> g =
      it != gathered_.end() ? it->second : StartGather(unit);
  if (g == nullptr) return nullptr;  // out of memory: status() says so
  if (g->refs == 0) {
    if (g->task) Fail(worker_->Wait(g->task));
    if (bf16() && options_.stage < 3) {
      options_.ops->bf16_to_float(compute_full_.data() + u.offset, g->buf,
                                  u.size);
    } else if (bf16()) {
      UnpackWiden(unit, g->packed, g->buf);
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

// ---- gradients ---------------------------------------------------------------

float* ZeroOptimizer::AcquireGrads(int unit) {
  const Unit& u = options_.units[unit];
  if (options_.stage < 2) return grads_full_.data() + u.offset;
  auto it = grads_open_.find(unit);
  if (it != grads_open_.end()) {
    ++it->second->refs;
    return it->second->mem.data();
  }
  // The pool grows to kMaxGradBuffers before any buffer is reused, so its
  // size (memory()) does not depend on how fast reduce-scatters finish.
  // Then: a buffer that is not open and whose reduce-scatter finished, else
  // wait for one in flight.
  std::shared_ptr<GradBuf> buf;
  if (grad_bufs_.size() < kMaxGradBuffers) {
    auto fresh = std::make_shared<GradBuf>();
    if (fresh->mem.Allocate(mem_, std::max<size_t>(max_unit_, 1))) {
      buf = fresh;
      grad_bufs_.push_back(buf);
    }
    // Out of memory: reuse one below, if there is one.
  }
  for (auto& b : grad_bufs_) {
    if (buf) break;
    if (!b->open && (!b->task || worker_->Done(b->task))) buf = b;
  }
  if (!buf) {
    for (auto& b : grad_bufs_) {
      if (!b->open) {
        Fail(worker_->Wait(b->task));
        buf = b;
        break;
      }
    }
  }
  if (!buf) {
    Fail(AllocError("a unit gradient buffer",
                    std::max<size_t>(max_unit_, 1) * sizeof(float)));
    return nullptr;
  }
  buf->task.reset();
  buf->open = true;
  buf->refs = 1;
  mem_->SetZero(buf->mem.data(), u.size * sizeof(float));
  grads_open_[unit] = buf;
  return buf->mem.data();
}

void ZeroOptimizer::ReleaseGrads(int unit) {
  if (options_.stage < 2) return;
  auto it = grads_open_.find(unit);
  if (it == grads_open_.end()) return;
  std::shared_ptr<GradBuf> buf = it->second;
  if (--buf->refs > 0) return;
  grads_open_.erase(it);
  buf->open = false;
  const ShardPiece piece = MyPiece(unit);
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* in = buf->mem.data();
  float* piece_out = rs_piece_.data();
  float* acc = grad_shard_.data() + piece.shard_offset;
  comm::Collective* comm = options_.comm;
  kernels::Ops* ops = comm_ops();
  const comm::Timeout timeout = options_.timeout;
  buf->task = worker_->Submit([=]() -> absl::Status {
    absl::Status s = comm->reduce_scatter(in, piece_out, counts, timeout);
    if (!s.ok()) return s;
    if (piece.size > 0) ops->add_inplace(acc, piece_out, piece.size);
    return absl::OkStatus();
  });
}

void ZeroOptimizer::ZeroGrads() {
  Fail(Drain());
  grads_full_.Zero();
  grad_shard_.Zero();
}

absl::Status ZeroOptimizer::Drain() {
  absl::Status s = worker_->Drain();
  // Prefetched but never acquired units are dropped.
  for (auto it = gathered_.begin(); it != gathered_.end();) {
    if (it->second->refs == 0) {
      ReturnBuffer(it->second->buf);
      if (it->second->packed != nullptr) free_packed_.push_back(it->second->packed);
      it = gathered_.erase(it);
    } else {
      ++it;
    }
  }
  return s;
}

// ---- step ----------------------------------------------------------------------

absl::Status ZeroOptimizer::AllreduceNormSquared(double* sum_sq) {
  // A double as two floats (hi + lo) so the sum keeps ~double precision;
  // they travel through a 2-float device buffer.
  const float hi = static_cast<float>(*sum_sq);
  float pair[2] = {hi, static_cast<float>(*sum_sq - hi)};
  norm_buf_.Upload(pair, 2);
  float* dev = norm_buf_.data();
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  absl::Status s = worker_->Run(
      [&] { return comm->allreduce(dev, 2, comm::ReduceOp::kSum, timeout); });
  if (!s.ok()) return s;
  norm_buf_.Download(pair, 2);
  if (absl::Status m = MemoryStatus(); !m.ok()) return m;
  *sum_sq = static_cast<double>(pair[0]) + static_cast<double>(pair[1]);
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::AllgatherParams() {
  if (options_.stage == 3) return absl::OkStatus();
  if (bf16()) {
    if (absl::Status s = Drain(); !s.ok()) return s;
    // Stage 0: rebuild the full masters first, then the compute copy.
    if (options_.stage == 0 && world_ > 1) {
      comm::Collective* comm = options_.comm;
      const comm::Timeout timeout = options_.timeout;
      for (size_t u = 0; u < options_.units.size(); ++u) {
        float* full = params_full_.data() + options_.units[u].offset;
        const float* mine = full + shard_map_[u].unit_offset;
        const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
        absl::Status s = worker_->Run(
            [&] { return comm->allgather(mine, full, counts, timeout); });
        if (!s.ok()) return s;
      }
    }
    return RefreshComputeFull();
  }
  if (world_ == 1) return MemoryStatus();
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const Unit& unit = options_.units[u];
    float* full = params_full_.data() + unit.offset;
    const float* mine = full + shard_map_[u].unit_offset;
    const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
    absl::Status s = worker_->Run(
        [&] { return comm->allgather(mine, full, counts, timeout); });
    if (!s.ok()) return s;
  }
  return MemoryStatus();
}

absl::Status ZeroOptimizer::AllgatherOptimizerState() {
  if (options_.stage != 0 || world_ == 1) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  if (offloaded_) {
    return absl::FailedPreconditionError(
        "zero: AllgatherOptimizerState while the optimizer state is offloaded");
  }
  for (kernels::DeviceArray<float>* state : {&m_, &v_}) {
    for (size_t u = 0; u < options_.units.size(); ++u) {
      float* full = state->data() + options_.units[u].offset;
      const float* mine = full + shard_map_[u].unit_offset;
      const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
      absl::Status s = worker_->Run(
          [&] { return comm->allgather(mine, full, counts, timeout); });
      if (!s.ok()) return s;
    }
  }
  return MemoryStatus();
}

absl::StatusOr<StepResult> ZeroOptimizer::Step(float lr, float max_grad_norm) {
  if (!status_.ok()) return status_;
  if (offloaded_) {
    return absl::FailedPreconditionError(
        "zero: Step while the optimizer state is offloaded "
        "(call RestoreOptimizerState first)");
  }
  if (absl::Status s = Drain(); !s.ok()) {
    Fail(s);
    return s;
  }
  kernels::Ops* ops = options_.ops;
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  const int stage = options_.stage;
  const AdamWConfig& a = options_.adamw;

  if (stage <= 1 && world_ > 1) {
    absl::Status s = worker_->Run([&] {
      return comm->allreduce(grads_full_.data(), psi_, comm::ReduceOp::kSum,
                             timeout);
    });
    if (!s.ok()) {
      Fail(s);
      return s;
    }
  }
  double sum_sq = 0;
  if (stage == 0) {
    sum_sq = ops->sum_squares(grads_full_.data(), psi_);
  } else {
    if (stage == 1) {
      for (const auto& p : shard_map_) {
        sum_sq += ops->sum_squares(
            grads_full_.data() + options_.units[p.unit].offset + p.unit_offset,
            p.size);
      }
    } else {
      sum_sq = ops->sum_squares(grad_shard_.data(), shard_size_);
    }
    if (world_ > 1) {
      absl::Status s = AllreduceNormSquared(&sum_sq);
      if (!s.ok()) {
        Fail(s);
        return s;
      }
    }
  }
  StepResult result;
  result.grad_norm = std::sqrt(std::max(sum_sq, 0.0));
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (result.grad_norm + 1e-6);
    if (coef < 1.0) result.clip_scale = coef;
  }
  const float scale = static_cast<float>(result.clip_scale);
  ++step_;
  if (stage == 0) {
    if (scale != 1.f) ops->scale(grads_full_.data(), scale, psi_);
    ops->adamw_step(params_full_.data(), grads_full_.data(), m_.data(),
                    v_.data(), psi_, lr, a.beta1, a.beta2, a.eps,
                    a.weight_decay, step_);
  } else if (stage == 1 || stage == 2) {
    for (const auto& p : shard_map_) {
      if (p.size == 0) continue;
      const size_t full_off = options_.units[p.unit].offset + p.unit_offset;
      float* g = stage == 1 ? grads_full_.data() + full_off
                            : grad_shard_.data() + p.shard_offset;
      if (scale != 1.f) ops->scale(g, scale, p.size);
      ops->adamw_step(MasterPiece(p), g, m_.data() + p.shard_offset,
                      v_.data() + p.shard_offset, p.size, lr, a.beta1,
                      a.beta2, a.eps, a.weight_decay, step_);
    }
    // fp32: allgather the updated pieces; bf16: allgather their bf16 copy.
    step_incomplete_ = true;
    if (absl::Status s = bf16() ? RefreshComputeFull() : AllgatherParams();
        !s.ok()) {
      Fail(s);
      return s;
    }
    step_incomplete_ = false;
  } else {
    if (scale != 1.f) ops->scale(grad_shard_.data(), scale, shard_size_);
    ops->adamw_step(param_shard_.data(), grad_shard_.data(), m_.data(),
                    v_.data(), shard_size_, lr, a.beta1, a.beta2, a.eps,
                    a.weight_decay, step_);
    if (bf16()) RefreshComputeShard();
  }
  if (bf16() && stage == 0) {
    if (absl::Status s = RefreshComputeFull(); !s.ok()) {
      Fail(s);
      return s;
    }
  }
  if (absl::Status s = MemoryStatus(); !s.ok()) {
    Fail(s);
    return s;
  }
  return result;
}

// ---- init / export / inference ----------------------------------------------

absl::Status ZeroOptimizer::InitFromFull(const float* full) {
  if (absl::Status s = Drain(); !s.ok()) return s;
  if (!master_sharded()) {
    params_full_.Upload(full, psi_);
  } else {
    for (const auto& p : shard_map_) {
      param_shard_.Upload(full + options_.units[p.unit].offset + p.unit_offset,
                          p.size, p.shard_offset);
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
      return AllocError("a unit gather buffer",
                        std::max<size_t>(max_unit_, 1) * sizeof(float));
    }
    for (const Unit& u : options_.units) {
      mem_->CopyToDevice(stage_buf, full + u.offset, u.size * sizeof(float));
      options_.ops->float_to_bf16(stage_buf, compute_full_.data() + u.offset,
                                  u.size);
    }
    ReturnBuffer(stage_buf);
  }
  if (bf16() && options_.stage == 3) RefreshComputeShard();
  grads_full_.Zero();
  grad_shard_.Zero();
  m_.Zero();
  v_.Zero();
  std::fill(m_host_.begin(), m_host_.end(), 0.f);
  std::fill(v_host_.begin(), v_host_.end(), 0.f);
  step_ = 0;
  return MemoryStatus();
}

absl::Status ZeroOptimizer::GatherMasters(float* dst) {
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const float* mine = param_shard_.data() + shard_map_[u].shard_offset;
    float* out = dst + options_.units[u].offset;
    const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
    absl::Status s = worker_->Run(
        [&] { return comm->allgather(mine, out, counts, timeout); });
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
    return AllocError("a unit gather buffer",
                      std::max<size_t>(max_unit_, 1) * sizeof(float));
  }
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  absl::Status s;
  for (size_t u = 0; s.ok() && u < options_.units.size(); ++u) {
    const float* mine = param_shard_.data() + shard_map_[u].shard_offset;
    const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
    s = worker_->Run([&] { return comm->allgather(mine, buf, counts, timeout); });
    if (s.ok()) {
      mem_->CopyToHost(out + options_.units[u].offset, buf,
                       options_.units[u].size * sizeof(float));
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

// ---- checkpoint access ---------------------------------------------------------

void ZeroOptimizer::CopyParamShard(float* out) const {
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    mem_->CopyToHost(out + p.shard_offset, MasterPiece(p), p.size * sizeof(float));
  }
}

void ZeroOptimizer::LoadParamShard(const float* in) {
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    mem_->CopyToDevice(MasterPiece(p), in + p.shard_offset, p.size * sizeof(float));
  }
  // Stage 3 refreshes its compute shard here; stages 0-2 in
  // AllgatherParams(), which every rank calls next.
  if (bf16() && options_.stage == 3) RefreshComputeShard();
}

void ZeroOptimizer::CopyOptimizerShard(float* m_out, float* v_out) const {
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    const size_t src = OptOffset(p);
    if (offloaded_) {
      std::copy_n(m_host_.begin() + src, p.size, m_out + p.shard_offset);
      std::copy_n(v_host_.begin() + src, p.size, v_out + p.shard_offset);
    } else {
      m_.Download(m_out + p.shard_offset, p.size, src);
      v_.Download(v_out + p.shard_offset, p.size, src);
    }
  }
}

void ZeroOptimizer::LoadOptimizerShard(const float* m_in, const float* v_in) {
  // Stage 0 keeps full moments: each rank loads its pieces; the others stay
  // as they were (callers load every rank's shard, see docs/parallelism.md).
  for (const auto& p : shard_map_) {
    if (p.size == 0) continue;
    const size_t dst = OptOffset(p);
    if (offloaded_) {
      std::copy_n(m_in + p.shard_offset, p.size, m_host_.begin() + dst);
      std::copy_n(v_in + p.shard_offset, p.size, v_host_.begin() + dst);
    } else {
      m_.Upload(m_in + p.shard_offset, p.size, dst);
      v_.Upload(v_in + p.shard_offset, p.size, dst);
    }
  }
}

absl::Status ZeroOptimizer::CopyFullState(float* params, float* m, float* v) const {
  if (options_.stage != 0) {
    return absl::FailedPreconditionError("the full state is only held at ZeRO stage 0");
  }
  params_full_.Download(params, psi_);
  if (offloaded_) {
    std::copy(m_host_.begin(), m_host_.end(), m);
    std::copy(v_host_.begin(), v_host_.end(), v);
  } else {
    m_.Download(m, psi_);
    v_.Download(v, psi_);
  }
  return MemoryStatus();
}

absl::Status ZeroOptimizer::CopyResidentParams(float* params) const {
  if (master_sharded()) {
    return absl::FailedPreconditionError("the fp32 parameters are sharded (ZeRO stage 3, or bf16 at stages 1-3)");
  }
  params_full_.Download(params, psi_);
  return MemoryStatus();
}

absl::Status ZeroOptimizer::OffloadOptimizerState() {
  if (offloaded_) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  m_host_.resize(m_.size());
  v_host_.resize(v_.size());
  m_.Download(m_host_.data(), m_.size());
  v_.Download(v_host_.data(), v_.size());
  if (absl::Status s = MemoryStatus(); !s.ok()) {
    m_host_ = std::vector<float>();
    v_host_ = std::vector<float>();
    return s;
  }
  m_.reset();
  v_.reset();
  offloaded_ = true;
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::RestoreOptimizerState() {
  if (!offloaded_) return absl::OkStatus();
  const size_t n = opt_size();
  if (!m_.Allocate(mem_, n) || !v_.Allocate(mem_, n)) {
    m_.reset();
    v_.reset();
    return AllocError("the optimizer moments", 2 * n * sizeof(float));
  }
  m_.Upload(m_host_.data(), n);
  v_.Upload(v_host_.data(), n);
  if (absl::Status s = MemoryStatus(); !s.ok()) return s;
  m_host_ = std::vector<float>();
  v_host_ = std::vector<float>();
  offloaded_ = false;
  return absl::OkStatus();
}

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport r;
  r.param_bytes = params_full_.bytes() + param_shard_.bytes();
  r.compute_bytes = compute_full_.bytes() + compute_shard_.bytes();
  r.grad_bytes = grads_full_.bytes() + grad_shard_.bytes();
  r.optimizer_bytes = m_.bytes() + v_.bytes();
  r.offloaded_bytes = (m_host_.size() + v_host_.size()) * sizeof(float);
  size_t temp = rs_piece_.bytes() + infer_full_.bytes() + pack_buf_.bytes() +
                norm_buf_.bytes();
  for (const auto& b : gather_bufs_) temp += b.bytes();
  for (const auto& b : packed_bufs_) temp += b.bytes();
  for (const auto& b : grad_bufs_) temp += b->mem.bytes();
  r.temp_bytes = temp;
  return r;
}

}  // namespace tandem::zero
