#include "worker/engine/peer_snapshot.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/phase_failure.h"
#include "worker/engine/job_context.h"
#include "worker/engine/phases.h"
#include "worker/engine/reference_policy.h"

namespace tandem::worker {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kTagSize = 0x7e5100;
constexpr uint32_t kTagData = 0x7e5101;
constexpr int64_t kMagic = 0x3250454552534e50;  // "PNSREEP2": version 2 (with the KL reference)

template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutFloats(std::string* out, const std::vector<float>& v) {
  Put<uint64_t>(out, v.size());
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > s_.size()) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetFloats(std::vector<float>* v) {
    uint64_t n = 0;
    if (!Get(&n) || n > (s_.size() - pos_) / sizeof(float)) return false;
    v->resize(n);
    std::memcpy(v->data(), s_.data() + pos_, n * sizeof(float));
    pos_ += n * sizeof(float);
    return true;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

std::vector<ckpt::Range> OwnedRanges(const zero::ZeroOptimizer& z) {
  std::vector<ckpt::Range> out;
  for (const auto& p : z.shard_map()) {
    if (p.size == 0) continue;
    out.push_back({z.units()[p.unit].offset + p.unit_offset, p.size});
  }
  return out;
}

absl::Status SendShard(JobContext& ctx, const SnapshotShard* shard, int peer) {
  const std::string bytes = shard ? shard->Serialize() : std::string();
  const uint64_t n = bytes.size();
  if (absl::Status st = ctx.collective->send(&n, sizeof n, peer, kTagSize, ctx.timeout); !st.ok()) return st;
  if (n == 0) return absl::OkStatus();
  return ctx.collective->send(bytes.data(), bytes.size(), peer, kTagData, ctx.timeout);
}

// An empty optional: the peer had nothing to send.
absl::Status RecvShard(JobContext& ctx, int peer, std::optional<SnapshotShard>* out) {
  uint64_t n = 0;
  if (absl::Status st = ctx.collective->recv(&n, sizeof n, peer, kTagSize, ctx.timeout); !st.ok()) return st;
  out->reset();
  if (n == 0) return absl::OkStatus();
  if (n > (uint64_t{1} << 40)) return absl::DataLossError("peer copy: absurd size from rank " + std::to_string(peer));
  std::string bytes(n, '\0');
  if (absl::Status st = ctx.collective->recv(bytes.data(), n, peer, kTagData, ctx.timeout); !st.ok()) return st;
  SnapshotShard shard;
  if (absl::Status st = SnapshotShard::Parse(bytes, &shard); !st.ok()) return st;
  *out = std::move(shard);
  return absl::OkStatus();
}

bool SameRanges(const std::vector<ckpt::Range>& a, const std::vector<ckpt::Range>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].offset != b[i].offset || a[i].count != b[i].count) return false;
  }
  return true;
}

}  // namespace

std::string SnapshotShard::Serialize() const {
  std::string out;
  out.reserve(96 + ranges.size() * 16 + bytes());
  Put(&out, kMagic);
  Put(&out, step);
  Put<int64_t>(&out, world);
  Put<int64_t>(&out, zero_stage);
  Put<int64_t>(&out, rank);
  Put(&out, optimizer_steps);
  Put(&out, policy_version);
  Put<uint64_t>(&out, ranges.size());
  for (const auto& r : ranges) {
    Put(&out, r.offset);
    Put(&out, r.count);
  }
  PutFloats(&out, params);
  PutFloats(&out, exp_avg);
  PutFloats(&out, exp_avg_sq);
  PutFloats(&out, ref_params);
  return out;
}

absl::Status SnapshotShard::Parse(const std::string& bytes, SnapshotShard* out) {
  Reader r(bytes);
  int64_t magic = 0, world = 0, stage = 0, rank = 0;
  uint64_t nranges = 0;
  bool ok = r.Get(&magic) && magic == kMagic && r.Get(&out->step) && r.Get(&world) && r.Get(&stage) && r.Get(&rank) &&
            r.Get(&out->optimizer_steps) && r.Get(&out->policy_version) && r.Get(&nranges) &&
            nranges <= bytes.size() / 16;
  if (ok) {
    out->ranges.resize(nranges);
    for (auto& rg : out->ranges) ok = ok && r.Get(&rg.offset) && r.Get(&rg.count);
  }
  ok = ok && r.GetFloats(&out->params) && r.GetFloats(&out->exp_avg) && r.GetFloats(&out->exp_avg_sq) &&
       r.GetFloats(&out->ref_params) && r.done();
  if (!ok) return absl::DataLossError("peer copy: malformed snapshot");
  out->world = static_cast<int>(world);
  out->zero_stage = static_cast<int>(stage);
  out->rank = static_cast<int>(rank);
  return absl::OkStatus();
}

void PeerSnapshots::KeepOnly(const std::string& job_id) {
  if (job_id_ != job_id) Clear();
  job_id_ = job_id;
}

void PeerSnapshots::Clear() {
  job_id_.clear();
  own_.reset();
  neighbour_.reset();
}

absl::Status ExchangePeerCopies(JobContext& ctx, SnapshotShard own, tandem::v1::ReportPhaseRequest* report) {
  if (ctx.peer == nullptr || ctx.world < 2) return absl::OkStatus();
  if (absl::Status st = ctx.zero->Drain(); !st.ok()) return st;
  const auto t0 = Clock::now();
  if (own.ref_params.empty() && ctx.ref_shard) {
    CopyReferencePieces(ctx, &own.ref_params);  // the shard is this rank's pieces
  } else if (own.ref_params.empty() && !ctx.ref_params.empty()) {
    // The KL reference policy (GRPO): this rank's pieces of it, as on disk.
    for (const auto& r : own.ranges) {
      if (r.offset + r.count > ctx.ref_params.size()) {
        return absl::InternalError("peer copy: KL reference smaller than the parameter layout");
      }
      own.ref_params.insert(own.ref_params.end(), ctx.ref_params.begin() + r.offset,
                            ctx.ref_params.begin() + r.offset + r.count);
    }
  }
  const int next = (ctx.rank + 1) % ctx.world;
  const int prev = (ctx.rank + ctx.world - 1) % ctx.world;
  std::optional<SnapshotShard> received;
  // send is a rendezvous: even ranks send first, odd ranks receive first.
  if (ctx.rank % 2 == 0) {
    if (absl::Status st = SendShard(ctx, &own, next); !st.ok()) return st;
    if (absl::Status st = RecvShard(ctx, prev, &received); !st.ok()) return st;
  } else {
    if (absl::Status st = RecvShard(ctx, prev, &received); !st.ok()) return st;
    if (absl::Status st = SendShard(ctx, &own, next); !st.ok()) return st;
  }
  if (!received || received->rank != prev || received->step != own.step) {
    // A peer that died or lags is the cluster's failure: the job recovers.
    return common::WithFailureKind(absl::DataLossError("peer copy: rank " + std::to_string(prev) +
                                                       " sent no copy of step " + std::to_string(own.step)),
                                   tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
  }
  const size_t bytes = own.bytes() + received->bytes();
  ctx.peer->KeepOnly(ctx.assignment.job_id());
  ctx.peer->own() = std::move(own);
  ctx.peer->neighbour() = std::move(received);
  auto* result = report->mutable_checkpoint();
  result->set_peer_copy(true);
  result->set_peer_copy_seconds(std::chrono::duration<double>(Clock::now() - t0).count());
  result->set_peer_copy_bytes(static_cast<int64_t>(bytes));
  return absl::OkStatus();
}

absl::Status RestoreFromPeers(JobContext& ctx, int64_t step, const std::vector<int>& receive_ranks,
                              tandem::v1::ReportPhaseRequest* report) {
  const auto t0 = Clock::now();
  auto listed = [&](int r) { return std::find(receive_ranks.begin(), receive_ranks.end(), r) != receive_ranks.end(); };
  const int next = (ctx.rank + 1) % ctx.world;
  const int prev = (ctx.rank + ctx.world - 1) % ctx.world;
  PeerSnapshots empty;
  PeerSnapshots& peer = ctx.peer != nullptr ? *ctx.peer : empty;
  const bool mine_ok_job = peer.job_id() == ctx.assignment.job_id();
  std::optional<SnapshotShard> shard;
  std::string problem;
  if (ctx.world < 2) problem = "needs at least 2 ranks";
  if (problem.empty() && listed(ctx.rank)) {
    // A replacement: the neighbour that kept our shard sends it.
    if (absl::Status st = RecvShard(ctx, next, &shard); !st.ok()) return st;
    if (!shard) problem = "rank " + std::to_string(next) + " holds no copy of rank " + std::to_string(ctx.rank);
  }
  if (ctx.world >= 2 && listed(prev)) {
    const SnapshotShard* copy = nullptr;
    auto& n = peer.neighbour();
    if (mine_ok_job && n && n->step == step && n->rank == prev && n->world == ctx.world) copy = &*n;
    if (absl::Status st = SendShard(ctx, copy, prev); !st.ok()) return st;
  }
  if (problem.empty() && !listed(ctx.rank)) {
    auto& o = peer.own();
    if (mine_ok_job && o && o->step == step && o->rank == ctx.rank && o->world == ctx.world) {
      shard = *o;
    } else {
      problem = "rank " + std::to_string(ctx.rank) + " holds no own copy of step " + std::to_string(step);
    }
  }
  if (problem.empty() && shard &&
      (shard->step != step || shard->world != ctx.world || !SameRanges(shard->ranges, OwnedRanges(*ctx.zero)) ||
       shard->params.size() != ctx.zero->shard_size() || shard->exp_avg.size() != ctx.zero->shard_size() ||
       shard->exp_avg_sq.size() != ctx.zero->shard_size() ||
       (!shard->ref_params.empty() && shard->ref_params.size() != ctx.zero->shard_size()))) {
    problem = "the copy of rank " + std::to_string(ctx.rank) + " does not match this world/ZeRO layout";
  }
  // Everyone agrees before anyone loads (a rank that cannot restore must not
  // leave the others waiting in AllgatherParams): [ranks that cannot restore,
  // ranks whose copy holds the KL reference].
  const bool has_ref = problem.empty() && shard && !shard->ref_params.empty();
  std::vector<double> failures = {problem.empty() ? 0.0 : 1.0, has_ref ? 1.0 : 0.0};
  if (absl::Status st = AllreduceSum(ctx, failures); !st.ok()) return st;
  if (!problem.empty()) return absl::FailedPreconditionError("peer restore: " + problem);
  if (failures[0] > 0) {
    return absl::FailedPreconditionError("peer restore: " + std::to_string(static_cast<int>(failures[0])) +
                                         " rank(s) hold no usable copy of step " + std::to_string(step));
  }
  const int ref_ranks = static_cast<int>(failures[1]);
  if (ref_ranks != 0 && ref_ranks != ctx.world) {
    return absl::FailedPreconditionError("peer restore: only " + std::to_string(ref_ranks) + " of " +
                                         std::to_string(ctx.world) + " copies of step " + std::to_string(step) +
                                         " hold the KL reference policy");
  }
  if (ref_ranks == ctx.world && ShardsReference(ctx)) {
    if (absl::Status st = MakeReferenceShard(ctx); !st.ok()) return st;
    ctx.ref_shard->LoadShard(shard->ref_params.data());
  } else if (ref_ranks == ctx.world) {
    ctx.ref_shard.reset();
    // Rebuild the full KL reference from every rank's pieces: load them as
    // the parameter shard, gather, then load the real parameters below.
    ctx.zero->LoadParamShard(shard->ref_params.data());
    if (absl::Status st = ctx.zero->AllgatherParams(); !st.ok()) return st;
    ctx.ref_params.assign(ctx.model->layout().total_floats(), 0.f);
    ctx.ref_device.reset();
    if (absl::Status st = ctx.zero->GatherFull(ctx.ref_params.data()); !st.ok()) return st;
  } else {
    ctx.ref_params.clear();  // set at the first ROLLOUT, as in a fresh run
    ctx.ref_device.reset();
    ctx.ref_shard.reset();
  }
  ctx.zero->LoadParamShard(shard->params.data());
  if (absl::Status st = ctx.zero->AllgatherParams(); !st.ok()) return st;
  ctx.zero->LoadOptimizerShard(shard->exp_avg.data(), shard->exp_avg_sq.data());
  if (absl::Status st = ctx.zero->AllgatherOptimizerState(); !st.ok()) return st;
  ctx.zero->set_step_count(shard->optimizer_steps);
  ctx.optimizer_steps = shard->optimizer_steps;
  ctx.policy_version = shard->policy_version;
  // The restored state is this rank's own copy again (a replacement holds
  // its own shard now; its neighbour's comes with the next checkpoint).
  peer.KeepOnly(ctx.assignment.job_id());
  if (listed(ctx.rank)) peer.own() = std::move(*shard);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto* setup = report->mutable_setup();
  setup->set_restored(true);
  setup->set_restored_step(step);
  setup->set_restore_source(tandem::v1::RESTORE_SOURCE_PEER);
  setup->set_restore_seconds(secs);
  report->add_log_lines(
      "restored step " + std::to_string(step) + " from peer memory" +
      (listed(ctx.rank) ? " (shard received from rank " + std::to_string(next) + ")" : " (own copy)") + " in " +
      std::to_string(secs) + " s");
  return absl::OkStatus();
}

}  // namespace tandem::worker
