#include "server/recovery/policy.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace tandem::server {

RecoveryPolicy EffectiveRecoveryPolicy(const tandem::v1::CoordinatorConfig& config, const tandem::v1::JobSpec& spec) {
  RecoveryPolicy p;
  if (config.replacement_timeout_ms() > 0) p.replacement_timeout_ms = config.replacement_timeout_ms();
  if (config.max_recoveries() > 0) p.max_recoveries = config.max_recoveries();
  if (config.preempt_checkpoint_budget_ms() > 0) {
    p.preempt_checkpoint_budget_ms = config.preempt_checkpoint_budget_ms();
  }
  const auto& r = spec.recovery();
  if (r.replacement_timeout_ms() > 0) p.replacement_timeout_ms = r.replacement_timeout_ms();
  if (r.max_recoveries() > 0) p.max_recoveries = r.max_recoveries();
  p.peer_copies = !r.no_peer_copies();
  p.degraded = r.degraded();
  const int workers = std::max(1, spec.cluster().workers());
  p.min_workers = spec.cluster().min_workers() > 0 ? std::min(spec.cluster().min_workers(), workers) : workers;
  return p;
}

std::optional<RankPlan> PlanRanks(const std::vector<std::string>& old_ids,
                                  const std::map<std::string, std::string>& old_names,
                                  const std::set<std::string>& survivors, const std::vector<Candidate>& idle,
                                  int world) {
  const int old_world = static_cast<int>(old_ids.size());
  std::vector<Candidate> pool = idle;
  auto take = [&pool](const std::string& prefer_name) -> std::optional<std::string> {
    if (pool.empty()) return std::nullopt;
    auto it = std::find_if(pool.begin(), pool.end(), [&](const Candidate& c) { return c.name == prefer_name; });
    if (it == pool.end()) it = pool.begin();
    std::string id = it->id;
    pool.erase(it);
    return id;
  };
  RankPlan plan;
  plan.same_world = world == old_world;
  if (plan.same_world) {
    // First give restarted workers (same name) their old rank, then fill.
    std::vector<std::string> ids(old_world);
    std::vector<bool> filled(old_world, false);
    for (int r = 0; r < old_world; ++r) {
      if (survivors.count(old_ids[r])) {
        ids[r] = old_ids[r];
        filled[r] = true;
      }
    }
    for (int r = 0; r < old_world; ++r) {
      if (filled[r]) continue;
      auto name = old_names.find(old_ids[r]);
      if (name == old_names.end()) continue;
      auto it = std::find_if(pool.begin(), pool.end(), [&](const Candidate& c) { return c.name == name->second; });
      if (it == pool.end()) continue;
      ids[r] = it->id;
      filled[r] = true;
      plan.replaced_ranks.push_back(r);
      pool.erase(it);
    }
    for (int r = 0; r < old_world; ++r) {
      if (filled[r]) continue;
      auto id = take("");
      if (!id) return std::nullopt;
      ids[r] = *id;
      plan.replaced_ranks.push_back(r);
    }
    std::sort(plan.replaced_ranks.begin(), plan.replaced_ranks.end());
    plan.worker_ids = std::move(ids);
    return plan;
  }
  for (const auto& id : old_ids) {
    if (survivors.count(id) && static_cast<int>(plan.worker_ids.size()) < world) plan.worker_ids.push_back(id);
  }
  while (static_cast<int>(plan.worker_ids.size()) < world) {
    auto id = take("");
    if (!id) return std::nullopt;
    plan.worker_ids.push_back(*id);
  }
  return plan;
}

bool PeerRestorePossible(const RankPlan& plan, int old_world, int64_t peer_step, int peer_world) {
  if (!plan.same_world || peer_step <= 0 || peer_world != old_world || old_world < 2) return false;
  std::set<int> replaced(plan.replaced_ranks.begin(), plan.replaced_ranks.end());
  for (int r : plan.replaced_ranks) {
    if (replaced.count((r + 1) % old_world)) return false;  // its holder is gone too
  }
  return true;
}

bool CheckpointVisible(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(std::filesystem::path(path) / "manifest.json", ec);
}

std::optional<tandem::v1::CheckpointRecord> ChooseCheckpoint(const std::vector<tandem::v1::CheckpointRecord>& records,
                                                             const std::set<std::string>& bad) {
  std::vector<const tandem::v1::CheckpointRecord*> usable;
  for (const auto& r : records) {
    if (!bad.count(r.path())) usable.push_back(&r);
  }
  std::sort(usable.begin(), usable.end(), [](auto* a, auto* b) {
    return a->step() != b->step() ? a->step() > b->step() : a->generation() > b->generation();
  });
  if (usable.empty()) return std::nullopt;
  for (const auto* r : usable) {
    if (CheckpointVisible(r->path())) return *r;
  }
  bool any_visible = false;
  for (const auto& r : records) any_visible = any_visible || CheckpointVisible(r.path());
  if (any_visible) return std::nullopt;  // the visible ones are all bad; the rest were deleted
  return *usable.front();
}

LogicalShares DegradedShares(const std::vector<int>& old_begin, const std::vector<int>& old_own,
                             const std::vector<int>& surviving_ranks, int old_world) {
  const bool normal = old_begin.size() != static_cast<size_t>(old_world) || old_own.size() != old_begin.size();
  LogicalShares out;
  for (size_t i = 0; i < surviving_ranks.size(); ++i) {
    const int r = surviving_ranks[i];
    out.begin.push_back(i == 0 ? 0 : normal ? r : old_begin[r]);
    out.own.push_back(normal ? r : old_own[r]);
  }
  return out;
}

int64_t StepFromCheckpointPath(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  if (base.empty()) base = std::filesystem::path(path).parent_path().filename().string();
  if (base.rfind("step-", 0) != 0) return -1;
  int64_t step = -1;
  if (!absl::SimpleAtoi(base.substr(5), &step)) return -1;
  return step;
}

}  // namespace tandem::server
