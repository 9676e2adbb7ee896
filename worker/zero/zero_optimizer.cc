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
  float* buf = nullptr;     // what the model reads (fp32)
  float* packed = nullptr;  // bf16 stage 3: the packed bf16 allgather target
  std::shared_ptr<CommWorker::Task> task;
  int refs = 0;
};

struct ZeroOptimizer::GradBuf {
  std::unique_ptr<float[]> mem;
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
  return std::unique_ptr<ZeroOptimizer>(new ZeroOptimizer(std::move(options)));
}

ZeroOptimizer::ZeroOptimizer(ZeroOptions options)
    : options_(std::move(options)) {
  rank_ = options_.comm->rank();
  world_ = options_.comm->size();
  for (const auto& u : options_.units) {
    psi_ += u.size;
    max_unit_ = std::max(max_unit_, u.size);
  }
  shard_map_ = ComputeShardMap(options_.units, rank_, world_);
  for (const auto& p : shard_map_) shard_size_ += p.size;
  const int stage = options_.stage;
  if (master_sharded()) {
    param_shard_.assign(shard_size_, 0.f);
  } else {
    params_full_.assign(psi_, 0.f);
  }
  if (bf16()) {
    if (stage <= 2) compute_full_.assign(psi_, 0);
    if (stage == 3) compute_shard_.assign(shard_size_, 0);
    if ((stage == 1 || stage == 2) && world_ > 1) {
      pack_buf_.assign(packed_floats(), 0.f);
    }
  }
  if (stage <= 1) grads_full_.assign(psi_, 0.f);
  if (stage >= 2) {
    grad_shard_.assign(shard_size_, 0.f);
    rs_piece_.assign((max_unit_ + world_ - 1) / world_, 0.f);
  }
  const size_t opt = stage == 0 ? psi_ : shard_size_;
  m_.assign(opt, 0.f);
  v_.assign(opt, 0.f);
  worker_ = std::make_unique<CommWorker>();
  view_ = std::make_unique<InferenceView>(this);
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
  packed_bufs_.push_back(std::make_unique<float[]>(packed_floats()));
  return packed_bufs_.back().get();
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
    std::memcpy(dst + out, packed + in, c * sizeof(uint16_t));
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
    if (piece.size % 2) slot[piece.size] = 0;  // padding travels as zeros
    absl::Status s = worker_->Run([&] {
      return comm->allgather(packed + mine, packed, counts, timeout);
    });
    if (!s.ok()) return s;
    UnpackBf16(unit, packed, compute_full_.data() + options_.units[u].offset);
  }
  return absl::OkStatus();
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
  gather_bufs_.push_back(std::make_unique<float[]>(std::max<size_t>(max_unit_, 1)));
  return gather_bufs_.back().get();
}

void ZeroOptimizer::ReturnBuffer(float* buf) { free_gather_.push_back(buf); }

std::shared_ptr<ZeroOptimizer::Gather> ZeroOptimizer::StartGather(int unit) {
  auto g = std::make_shared<Gather>();
  g->unit = unit;
  g->buf = TakeBuffer();
  gathered_[unit] = g;
  // bf16 stages 0-2: the compute copy is resident; AcquireParams widens it.
  if (options_.stage < 3) return g;
  const ShardPiece piece = MyPiece(unit);
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  if (bf16()) {
    // The unit's bf16 pieces travel packed (half the bytes of fp32); my
    // piece is copied into its slot and gathered in place.
    g->packed = TakePacked();
    const std::vector<size_t> counts = PackedCounts(unit);
    size_t mine = 0;
    for (int r = 0; r < rank_; ++r) mine += counts[r];
    uint16_t* slot = reinterpret_cast<uint16_t*>(g->packed + mine);
    std::memcpy(slot, compute_shard_.data() + piece.shard_offset,
                piece.size * sizeof(uint16_t));
    if (piece.size % 2) slot[piece.size] = 0;  // padding travels as zeros
    float* packed = g->packed;
    g->task = worker_->Submit([=] {
      return comm->allgather(packed + mine, packed, counts, timeout);
    });
    return g;
  }
  const std::vector<size_t> counts = UnitCounts(unit);
  const float* src = param_shard_.data() + piece.shard_offset;
  float* dst = g->buf;
  g->task = worker_->Submit([=] {
    return comm->allgather(src, dst, counts, timeout);
  });
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
    return it->second->mem.get();
  }
  // A free buffer: not open and its reduce-scatter (if any) finished.
  std::shared_ptr<GradBuf> buf;
  for (auto& b : grad_bufs_) {
    if (!b->open && (!b->task || worker_->Done(b->task))) {
      buf = b;
      break;
    }
  }
  if (!buf && grad_bufs_.size() >= kMaxGradBuffers) {
    for (auto& b : grad_bufs_) {
      if (!b->open) {
        Fail(worker_->Wait(b->task));
        buf = b;
        break;
      }
    }
  }
  if (!buf) {
    buf = std::make_shared<GradBuf>();
    buf->mem = std::make_unique<float[]>(std::max<size_t>(max_unit_, 1));
    grad_bufs_.push_back(buf);
  }
  buf->task.reset();
  buf->open = true;
  buf->refs = 1;
  std::memset(buf->mem.get(), 0, u.size * sizeof(float));
  grads_open_[unit] = buf;
  return buf->mem.get();
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
  const float* in = buf->mem.get();
  float* piece_out = rs_piece_.data();
  float* acc = grad_shard_.data() + piece.shard_offset;
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  buf->task = worker_->Submit([=]() -> absl::Status {
    absl::Status s = comm->reduce_scatter(in, piece_out, counts, timeout);
    if (!s.ok()) return s;
    for (size_t i = 0; i < piece.size; ++i) acc[i] += piece_out[i];
    return absl::OkStatus();
  });
}

void ZeroOptimizer::ZeroGrads() {
  Fail(Drain());
  std::fill(grads_full_.begin(), grads_full_.end(), 0.f);
  std::fill(grad_shard_.begin(), grad_shard_.end(), 0.f);
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
  // A double as two floats (hi + lo) so the sum keeps ~double precision.
  const float hi = static_cast<float>(*sum_sq);
  float pair[2] = {hi, static_cast<float>(*sum_sq - hi)};
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  absl::Status s = worker_->Run(
      [&] { return comm->allreduce(pair, 2, comm::ReduceOp::kSum, timeout); });
  if (!s.ok()) return s;
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
  if (world_ == 1) return absl::OkStatus();
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
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::AllgatherOptimizerState() {
  if (options_.stage != 0 || world_ == 1) return absl::OkStatus();
  if (absl::Status s = Drain(); !s.ok()) return s;
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (std::vector<float>* state : {&m_, &v_}) {
    for (size_t u = 0; u < options_.units.size(); ++u) {
      float* full = state->data() + options_.units[u].offset;
      const float* mine = full + shard_map_[u].unit_offset;
      const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
      absl::Status s = worker_->Run(
          [&] { return comm->allgather(mine, full, counts, timeout); });
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> ZeroOptimizer::Step(float lr, float max_grad_norm) {
  if (!status_.ok()) return status_;
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
    if (absl::Status s = bf16() ? RefreshComputeFull() : AllgatherParams();
        !s.ok()) {
      Fail(s);
      return s;
    }
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
  return result;
}

// ---- init / export / inference ----------------------------------------------

absl::Status ZeroOptimizer::InitFromFull(const float* full) {
  if (absl::Status s = Drain(); !s.ok()) return s;
  if (!master_sharded()) {
    std::copy(full, full + psi_, params_full_.begin());
  } else {
    for (const auto& p : shard_map_) {
      const float* src = full + options_.units[p.unit].offset + p.unit_offset;
      std::copy(src, src + p.size, param_shard_.begin() + p.shard_offset);
    }
  }
  // Every rank converts the same full vector: the same bits everywhere.
  if (bf16() && options_.stage <= 2) {
    options_.ops->float_to_bf16(full, compute_full_.data(), psi_);
  }
  if (bf16() && options_.stage == 3) RefreshComputeShard();
  std::fill(grads_full_.begin(), grads_full_.end(), 0.f);
  std::fill(grad_shard_.begin(), grad_shard_.end(), 0.f);
  std::fill(m_.begin(), m_.end(), 0.f);
  std::fill(v_.begin(), v_.end(), 0.f);
  step_ = 0;
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::GatherFull(float* out) {
  if (absl::Status s = Drain(); !s.ok()) return s;
  if (!master_sharded()) {
    std::copy(params_full_.begin(), params_full_.end(), out);
    return absl::OkStatus();
  }
  if (in_inference_ && !bf16()) {  // bf16: infer_full_ is the compute copy
    std::copy(infer_full_.begin(), infer_full_.end(), out);
    return absl::OkStatus();
  }
  comm::Collective* comm = options_.comm;
  const comm::Timeout timeout = options_.timeout;
  for (size_t u = 0; u < options_.units.size(); ++u) {
    const float* mine = param_shard_.data() + shard_map_[u].shard_offset;
    float* dst = out + options_.units[u].offset;
    const std::vector<size_t> counts = UnitCounts(static_cast<int>(u));
    absl::Status s = worker_->Run(
        [&] { return comm->allgather(mine, dst, counts, timeout); });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::BeginInference() {
  if (in_inference_ || (options_.stage < 3 && !bf16())) return absl::OkStatus();
  infer_full_.assign(psi_, 0.f);
  absl::Status s;
  if (!bf16()) {
    s = GatherFull(infer_full_.data());
  } else if (options_.stage < 3) {
    // The resident bf16 compute copy, widened once for the whole rollout.
    options_.ops->bf16_to_float(compute_full_.data(), infer_full_.data(), psi_);
  } else {
    // Gather the bf16 compute shards unit by unit and widen them.
    s = Drain();
    for (size_t u = 0; s.ok() && u < options_.units.size(); ++u) {
      const int unit = static_cast<int>(u);
      auto g = StartGather(unit);
      s = worker_->Wait(g->task);
      if (s.ok()) UnpackWiden(unit, g->packed, infer_full_.data() + options_.units[u].offset);
      ReleaseGather(gathered_.find(unit));
    }
  }
  if (!s.ok()) {
    infer_full_ = std::vector<float>();
    return s;
  }
  in_inference_ = true;
  return absl::OkStatus();
}

void ZeroOptimizer::EndInference() {
  if (!in_inference_) return;
  in_inference_ = false;
  infer_full_ = std::vector<float>();  // frees the memory
}

model::ParamProvider& ZeroOptimizer::inference_view() { return *view_; }

// ---- checkpoint access ---------------------------------------------------------

void ZeroOptimizer::CopyParamShard(float* out) const {
  for (const auto& p : shard_map_) {
    const float* src = MasterPiece(p);
    std::copy(src, src + p.size, out + p.shard_offset);
  }
}

void ZeroOptimizer::LoadParamShard(const float* in) {
  for (const auto& p : shard_map_) {
    std::copy(in + p.shard_offset, in + p.shard_offset + p.size, MasterPiece(p));
  }
  // Stage 3 refreshes its compute shard here; stages 0-2 in
  // AllgatherParams(), which every rank calls next.
  if (bf16() && options_.stage == 3) RefreshComputeShard();
}

void ZeroOptimizer::CopyOptimizerShard(float* m_out, float* v_out) const {
  for (const auto& p : shard_map_) {
    const size_t src = options_.stage == 0
                           ? options_.units[p.unit].offset + p.unit_offset
                           : p.shard_offset;
    std::copy(m_.begin() + src, m_.begin() + src + p.size, m_out + p.shard_offset);
    std::copy(v_.begin() + src, v_.begin() + src + p.size, v_out + p.shard_offset);
  }
}

void ZeroOptimizer::LoadOptimizerShard(const float* m_in, const float* v_in) {
  // Stage 0 keeps full moments: each rank loads its pieces; the others stay
  // as they were (callers load every rank's shard, see docs/parallelism.md).
  for (const auto& p : shard_map_) {
    const size_t dst = options_.stage == 0
                           ? options_.units[p.unit].offset + p.unit_offset
                           : p.shard_offset;
    std::copy(m_in + p.shard_offset, m_in + p.shard_offset + p.size,
              m_.begin() + dst);
    std::copy(v_in + p.shard_offset, v_in + p.shard_offset + p.size,
              v_.begin() + dst);
  }
}

absl::Status ZeroOptimizer::CopyFullState(float* params, float* m, float* v) const {
  if (options_.stage != 0) {
    return absl::FailedPreconditionError("the full state is only held at ZeRO stage 0");
  }
  std::copy(params_full_.begin(), params_full_.end(), params);
  std::copy(m_.begin(), m_.end(), m);
  std::copy(v_.begin(), v_.end(), v);
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::OffloadOptimizerState() {
  offloaded_ = true;  // CPU backend: the state already lives in host memory
  return absl::OkStatus();
}

absl::Status ZeroOptimizer::RestoreOptimizerState() {
  offloaded_ = false;
  return absl::OkStatus();
}

MemoryReport ZeroOptimizer::memory() const {
  MemoryReport r;
  r.param_bytes = (params_full_.size() + param_shard_.size()) * sizeof(float);
  r.compute_bytes =
      (compute_full_.size() + compute_shard_.size()) * sizeof(uint16_t);
  r.grad_bytes = (grads_full_.size() + grad_shard_.size()) * sizeof(float);
  r.optimizer_bytes = (m_.size() + v_.size()) * sizeof(float);
  const size_t unit_buf = std::max<size_t>(max_unit_, 1) * sizeof(float);
  r.temp_bytes = (gather_bufs_.size() + grad_bufs_.size()) * unit_buf +
                 packed_bufs_.size() * packed_floats() * sizeof(float) +
                 (rs_piece_.size() + infer_full_.size() + pack_buf_.size()) *
                     sizeof(float);
  return r;
}

}  // namespace tandem::zero
