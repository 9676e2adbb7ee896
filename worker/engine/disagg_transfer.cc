#include "worker/engine/disagg_transfer.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/rl/sft_data.h"

namespace tandem::worker::disagg {

namespace {

constexpr uint32_t kMagic = 0x54445442;  // "TDTB"

class Writer {
 public:
  void U32(uint32_t v) { words_.push_back(v); }
  void I64(int64_t v) {
    uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    U32(static_cast<uint32_t>(u));
    U32(static_cast<uint32_t>(u >> 32));
  }
  void F64(double v) {
    int64_t i;
    std::memcpy(&i, &v, sizeof i);
    I64(i);
  }
  void F32(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    U32(u);
  }
  std::vector<float> Finish() const {
    std::vector<float> out(words_.size());
    if (!words_.empty()) std::memcpy(out.data(), words_.data(), words_.size() * sizeof(uint32_t));
    return out;
  }

 private:
  std::vector<uint32_t> words_;
};

class Reader {
 public:
  explicit Reader(std::span<const float> words) : words_(words) {}
  bool U32(uint32_t* v) {
    if (pos_ >= words_.size()) return false;
    std::memcpy(v, &words_[pos_++], sizeof *v);
    return true;
  }
  bool I64(int64_t* v) {
    uint32_t lo, hi;
    if (!U32(&lo) || !U32(&hi)) return false;
    const uint64_t u = (static_cast<uint64_t>(hi) << 32) | lo;
    std::memcpy(v, &u, sizeof *v);
    return true;
  }
  bool F64(double* v) {
    int64_t i;
    if (!I64(&i)) return false;
    std::memcpy(v, &i, sizeof *v);
    return true;
  }
  size_t left() const { return words_.size() - pos_; }
  bool Ints(uint32_t n, std::vector<int32_t>* out) {
    if (n > left()) return false;
    out->resize(n);
    if (n > 0) std::memcpy(out->data(), &words_[pos_], n * sizeof(int32_t));
    pos_ += n;
    return true;
  }
  bool Floats(uint32_t n, std::vector<float>* out) {
    if (n > left()) return false;
    out->assign(words_.begin() + pos_, words_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }

 private:
  std::span<const float> words_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<float> Pack(const RolloutBatch& batch) {
  Writer w;
  w.U32(kMagic);
  w.I64(batch.step);
  w.I64(batch.generated_tokens);
  w.F64(batch.generate_seconds);
  w.U32(static_cast<uint32_t>(batch.trajectories.size()));
  for (const rl::Trajectory& t : batch.trajectories) {
    w.I64(t.group);
    w.I64(t.policy_version);
    w.U32(static_cast<uint32_t>(t.prompt_ids.size()));
    w.U32(static_cast<uint32_t>(t.completion_ids.size()));
    w.U32(static_cast<uint32_t>(t.logp_sampled.size()));
    for (int32_t id : t.prompt_ids) w.U32(static_cast<uint32_t>(id));
    for (int32_t id : t.completion_ids) w.U32(static_cast<uint32_t>(id));
    for (float l : t.logp_sampled) w.F32(l);
  }
  return w.Finish();
}

absl::StatusOr<RolloutBatch> Unpack(std::span<const float> words) {
  Reader r(words);
  RolloutBatch b;
  uint32_t magic = 0, n = 0;
  const auto bad = [](const char* what) {
    return absl::DataLossError(absl::StrCat("disaggregated trajectory transfer: malformed batch (", what, ")"));
  };
  if (!r.U32(&magic) || magic != kMagic) return bad("magic");
  if (!r.I64(&b.step) || !r.I64(&b.generated_tokens) || !r.F64(&b.generate_seconds) || !r.U32(&n)) {
    return bad("header");
  }
  if (n > r.left()) return bad("count");
  b.trajectories.resize(n);
  for (rl::Trajectory& t : b.trajectories) {
    uint32_t np = 0, nc = 0, nl = 0;
    if (!r.I64(&t.group) || !r.I64(&t.policy_version) || !r.U32(&np) || !r.U32(&nc) || !r.U32(&nl)) {
      return bad("trajectory header");
    }
    if (!r.Ints(np, &t.prompt_ids) || !r.Ints(nc, &t.completion_ids) || !r.Floats(nl, &t.logp_sampled)) {
      return bad("trajectory body");
    }
  }
  if (r.left() != 0) return bad("trailing words");
  return b;
}

absl::StatusOr<Selection> SelectForTrainer(std::vector<rl::Trajectory> all, int64_t current_version,
                                           int64_t max_staleness, int group_size, int train_rank, int train_world) {
  if (group_size < 1 || train_world < 1 || train_rank < 0 || train_rank >= train_world) {
    return absl::InvalidArgumentError("SelectForTrainer: bad group size or trainer rank");
  }
  Selection sel;
  sel.received = static_cast<int64_t>(all.size());
  std::stable_sort(all.begin(), all.end(),
                   [](const rl::Trajectory& a, const rl::Trajectory& b) { return a.group < b.group; });
  // Whole groups, one version each (one rollout rank generated a group with
  // one set of weights).
  std::map<int64_t, int> sizes;
  for (size_t i = 0; i < all.size(); ++i) {
    sizes[all[i].group]++;
    if (i > 0 && all[i].group == all[i - 1].group && all[i].policy_version != all[i - 1].policy_version) {
      return absl::InternalError(absl::StrCat("group ", all[i].group, " mixes policy versions ",
                                              all[i - 1].policy_version, " and ", all[i].policy_version));
    }
  }
  for (const auto& [group, n] : sizes) {
    if (n != group_size) {
      return absl::InternalError(
          absl::StrCat("group ", group, " arrived with ", n, " trajectories, expected ", group_size));
    }
  }
  auto stats = rl::DropStale(&all, current_version, max_staleness);
  if (!stats.ok()) return stats.status();
  sel.dropped_stale = stats->dropped;
  const int64_t groups = static_cast<int64_t>(all.size()) / group_size;
  const int64_t usable = groups - groups % train_world;
  sel.dropped_uneven = (groups - usable) * group_size;
  all.resize(static_cast<size_t>(usable * group_size));
  sel.kept = static_cast<int64_t>(all.size());
  double sum = 0;
  for (const rl::Trajectory& t : all) {
    const int64_t s = current_version - t.policy_version;
    sel.max_staleness = std::max(sel.max_staleness, s);
    sum += static_cast<double>(s);
  }
  sel.mean_staleness = all.empty() ? 0 : sum / static_cast<double>(all.size());
  const rl::IndexRange mine = rl::RankSlice(usable, train_rank, train_world);
  sel.mine.assign(std::make_move_iterator(all.begin() + mine.begin * group_size),
                  std::make_move_iterator(all.begin() + mine.end * group_size));
  return sel;
}

}  // namespace tandem::worker::disagg
