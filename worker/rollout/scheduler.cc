#include "worker/rollout/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace tandem::rollout {

Scheduler::Scheduler(const SchedulerOptions& options) : opt_(options) {
  TANDEM_CHECK(opt_.max_batch_tokens > 0 && opt_.max_seqs > 0);
  pools_.push_back({BlockManager(opt_.num_blocks, opt_.block_size), opt_.window, opt_.sinks});
  if (opt_.windowed.num_blocks > 0) {
    TANDEM_CHECK(opt_.window == 0 && opt_.windowed.window > 0);
    pools_.push_back(
        {BlockManager(opt_.windowed.num_blocks, opt_.block_size), opt_.windowed.window, opt_.windowed.sinks});
  }
  for (int i = opt_.state_slots - 1; i >= 0; --i) free_slots_.push_back(i);
}

void Scheduler::StartRunning(int s) {
  Seq& q = seqs_[s];
  q.state = State::kRunning;
  running_.push_back(s);
  if (opt_.state_slots > 0) {
    // Running sequences never exceed min(max_seqs, sequences) <= state_slots.
    TANDEM_CHECK(!free_slots_.empty());
    q.slot = free_slots_.back();
    free_slots_.pop_back();
  }
}

void Scheduler::StopRunning(int s) {
  Seq& q = seqs_[s];
  running_.erase(std::find(running_.begin(), running_.end(), s));
  if (q.slot >= 0) free_slots_.push_back(q.slot);
  q.slot = -1;
}

bool Scheduler::AnyWindow() const {
  return std::any_of(pools_.begin(), pools_.end(), [](const Pool& p) { return p.window > 0; });
}

bool Scheduler::CanPrepare(const Seq& q, int from, int to) const {
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (pools_[p].blocks.BlocksNeeded(q.tables[p], from, to) > pools_[p].blocks.free_blocks()) return false;
  }
  return true;
}

bool Scheduler::PrepareAll(Seq& q, int from, int to, std::vector<BlockCopy>* copies) {
  if (!CanPrepare(q, from, to)) return false;
  for (size_t p = 0; p < pools_.size(); ++p) {
    const size_t before = copies->size();
    TANDEM_CHECK(pools_[p].blocks.Prepare(q.tables[p], from, to, copies));
    for (size_t i = before; i < copies->size(); ++i) (*copies)[i].pool = static_cast<int>(p);
  }
  return true;
}

void Scheduler::FreeAll(Seq& q) {
  for (size_t p = 0; p < pools_.size(); ++p) pools_[p].blocks.Free(q.tables[p]);
}

void Scheduler::ForkAll(Seq& q, const Seq& from, int n) {
  for (size_t p = 0; p < pools_.size(); ++p) {
    q.tables[p] = pools_[p].blocks.Fork(from.tables[p], pools_[p].blocks.BlocksFor(n));
  }
}

absl::StatusOr<int> Scheduler::Add(std::vector<int32_t> prompt, int group, int max_new_tokens) {
  if (prompt.empty()) return absl::InvalidArgumentError("rollout: empty prompt");
  const int64_t positions = static_cast<int64_t>(prompt.size()) + std::max(max_new_tokens, 0);
  const int64_t table_len = (positions + opt_.block_size - 1) / opt_.block_size;
  for (size_t p = 0; p < pools_.size(); ++p) {
    const Pool& pool = pools_[p];
    int64_t need = table_len;
    // With windows, one row per step needs the window's blocks and the row's
    // (the table keeps its full length, released entries included).
    if (pool.window > 0) {
      need = std::min<int64_t>(need, pool.SinkBlocks() + (pool.window - 1) / opt_.block_size + 2);
    }
    if (need > pool.blocks.num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollout: a sequence of ", positions, " positions needs ", need, " KV cache blocks",
                       p > 0 ? " in the windowed layers" : "", " but the cache holds ", pool.blocks.num_blocks(),
                       "; raise rollout.kv_cache_bytes or rollout.kv_cache_fraction (or lower rl.max_new_tokens)"));
    }
  }
  max_blocks_ = std::max<int>(max_blocks_, static_cast<int>(table_len));
  max_positions_ = std::max<int>(max_positions_, static_cast<int>(positions));
  Seq s;
  s.prompt_len = static_cast<int>(prompt.size());
  s.tokens = std::move(prompt);
  s.tokens.reserve(positions);
  s.group = group;
  seqs_.push_back(std::move(s));
  const int id = static_cast<int>(seqs_.size()) - 1;
  waiting_.push_back(id);
  return id;
}

int Scheduler::PromptDonor(int s) const {
  const Seq& q = seqs_[s];
  if (!opt_.share_prompts || opt_.state_slots > 0 || q.group < 0 || q.prompt_len < 2) return -1;
  // The first position s computes after the fork; with windows, its keys
  // from there back must still be in the donor's blocks.
  const int from = static_cast<int>(q.tokens.size()) == q.prompt_len ? q.prompt_len - 1 : q.prompt_len;
  for (int r : running_) {
    const Seq& d = seqs_[r];
    if (d.group != q.group || d.computed < d.prompt_len) continue;
    bool holds = true;
    for (size_t p = 0; p < pools_.size() && holds; ++p) {
      const Pool& pool = pools_[p];
      if (pool.window <= 0) continue;
      const int end = pool.blocks.BlocksFor(q.prompt_len);
      for (int b = std::max(0, from - pool.window + 1) / opt_.block_size; b < end && holds; ++b) {
        holds = d.tables[p][b] >= 0;
      }
    }
    if (holds) return r;
  }
  return -1;
}

int Scheduler::Active() const {
  int n = static_cast<int>(running_.size());
  for (int s : running_) n += static_cast<int>(seqs_[s].followers.size());
  return n;
}

void Scheduler::Preempt(int s) {
  Seq& q = seqs_[s];
  FreeAll(q);
  q.computed = 0;
  StopRunning(s);
  q.state = State::kWaiting;
  for (auto it = q.followers.rbegin(); it != q.followers.rend(); ++it) {
    seqs_[*it].state = State::kWaiting;
    waiting_.push_front(*it);
  }
  q.followers.clear();
  waiting_.push_front(s);
  ++stats_.preemptions;
}

bool Scheduler::Reserve(int s, int from, int to, Step* step) {
  for (;;) {
    if (PrepareAll(seqs_[s], from, to, &step->copies)) return true;
    // The newest running sequence not in this step's plan (and not s).
    int victim = -1;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      const bool planned =
          std::any_of(step->chunks.begin(), step->chunks.end(), [&](const Chunk& c) { return c.seq == *it; });
      if (*it != s && !planned) {
        victim = *it;
        break;
      }
    }
    if (victim < 0) return false;
    Preempt(victim);
  }
}

void Scheduler::Plan(int s, int n, Step* step) {
  Seq& q = seqs_[s];
  const int start = q.computed;
  step->chunks.push_back({s, start, n, step->rows});
  const int last_row = step->rows + n - 1;
  step->rows += n;
  stats_.prefill_tokens += std::max(0, std::min(start + n, q.prompt_len) - start);
  stats_.recomputed_tokens += std::max(0, std::min(start + n, q.high_water) - start);
  if (start + n == static_cast<int>(q.tokens.size())) {
    step->samples.push_back({s, last_row});
    if (start + n == q.prompt_len) {
      for (int f : q.followers) {
        step->samples.push_back({f, last_row});
        step->forks.emplace_back(f, s);
      }
    }
  }
}

bool Scheduler::Schedule(Step* step) {
  step->Clear();
  if (finished_ == num_seqs()) return false;
  int budget = opt_.max_batch_tokens;
  // Decode rows, then prefill chunks, oldest first. Reserve may preempt
  // sequences later in running_ (or s itself when it is the newest).
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      const int s = running_[i];
      Seq& q = seqs_[s];
      const int remaining = static_cast<int>(q.tokens.size()) - q.computed;
      if ((pass == 0) != (remaining == 1)) continue;
      int n = std::min(remaining, budget);
      if (!Reserve(s, q.computed, q.computed + n, step)) {
        // No sequence left to preempt: a prefill chunk shrinks to what
        // fits; a decode (or a chunk with no room at all) gives its blocks
        // back.
        int fits = 0;
        if (remaining > 1) {
          fits = n;
          for (size_t p = 0; p < pools_.size(); ++p) {
            const BlockManager& bm = pools_[p].blocks;
            const BlockTable& t = q.tables[p];
            const int first = q.computed / opt_.block_size;
            const int cow = first < static_cast<int>(t.size()) && t[first] >= 0 && bm.ref_count(t[first]) > 1 ? 1 : 0;
            fits = std::min(fits, (static_cast<int>(t.size()) + bm.free_blocks() - cow) * opt_.block_size - q.computed);
          }
        }
        if (fits > 0 && PrepareAll(q, q.computed, q.computed + fits, &step->copies)) {
          n = fits;
        } else {
          Preempt(s);
          --i;
          continue;
        }
      }
      Plan(s, n, step);
      budget -= n;
    }
  }
  // Admissions.
  const bool admit = !opt_.static_batch || running_.empty();
  while (admit && !waiting_.empty() && budget > 0 && Active() < opt_.max_seqs) {
    const int s = waiting_.front();
    Seq& q = seqs_[s];
    auto watermark = [&](const Pool& p) { return running_.empty() ? 0 : p.Watermark(); };
    if (const int donor = PromptDonor(s); donor >= 0) {
      // A sibling still holds the prompt's blocks: fork them and recompute
      // only the generated positions (a preempted sample) or, for a sample
      // that has not started, the prompt's last position (its logits give
      // the first token), as a prefix cache hit does.
      ForkAll(q, seqs_[donor], q.prompt_len);
      const int from = static_cast<int>(q.tokens.size()) == q.prompt_len ? q.prompt_len - 1 : q.prompt_len;
      const int n = std::min(static_cast<int>(q.tokens.size()) - from, budget);
      bool room = true;
      for (size_t p = 0; p < pools_.size(); ++p) {
        const BlockManager& bm = pools_[p].blocks;
        room &= bm.BlocksNeeded(q.tables[p], from, from + n) + watermark(pools_[p]) <= bm.free_blocks();
      }
      if (!room) {
        FreeAll(q);
        break;
      }
      waiting_.pop_front();
      q.computed = from;
      StartRunning(s);
      stats_.prompt_tokens_saved += from;
      TANDEM_CHECK(PrepareAll(q, from, from + n, &step->copies));
      Plan(s, n, step);
      budget -= n;
      continue;
    }
    int n = std::min(static_cast<int>(q.tokens.size()), budget);
    // With windows a sequence may outgrow the cache: its first chunk takes
    // what is free.
    bool room = true;
    for (const Pool& p : pools_) {
      if (p.window > 0) n = std::min(n, std::max(0, p.blocks.free_blocks() - watermark(p)) * opt_.block_size);
    }
    for (const Pool& p : pools_) room &= p.blocks.BlocksFor(n) + watermark(p) <= p.blocks.free_blocks();
    if (n <= 0 || !room) break;
    waiting_.pop_front();
    StartRunning(s);
    if (opt_.share_prompts && q.group >= 0 && q.tokens.size() == static_cast<size_t>(q.prompt_len)) {
      for (auto it = waiting_.begin(); it != waiting_.end() && Active() < opt_.max_seqs;) {
        Seq& f = seqs_[*it];
        if (f.group == q.group && f.tokens.size() == static_cast<size_t>(f.prompt_len)) {
          f.state = State::kAttached;
          q.followers.push_back(*it);
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    TANDEM_CHECK(PrepareAll(q, 0, n, &step->copies));
    Plan(s, n, step);
    budget -= n;
  }
  stats_.cow_copies += static_cast<int64_t>(step->copies.size());
  stats_.max_running = std::max(stats_.max_running, Active());
  if (step->rows > 0) ++stats_.steps;
  return true;
}

void Scheduler::Commit(const Step& step) {
  for (const Chunk& c : step.chunks) {
    Seq& q = seqs_[c.seq];
    q.computed = c.start + c.n;
    q.high_water = std::max(q.high_water, q.computed);
    for (size_t p = 0; p < pools_.size(); ++p) {
      Pool& pool = pools_[p];
      if (pool.window <= 0) continue;
      // The next row (position `computed`) reads keys from computed - window + 1.
      const int first_kept = q.computed - pool.window + 1;
      if (first_kept > 0) pool.blocks.ReleaseRange(q.tables[p], pool.SinkBlocks(), first_kept / opt_.block_size);
    }
  }
  for (const auto& [f, leader] : step.forks) {
    Seq& q = seqs_[f];
    Seq& l = seqs_[leader];
    ForkAll(q, l, l.prompt_len);
    q.computed = q.high_water = q.prompt_len;
    StartRunning(f);
    stats_.prompt_tokens_saved += q.prompt_len;
    l.followers.erase(std::find(l.followers.begin(), l.followers.end(), f));
  }
}

void Scheduler::Append(int s, int32_t token) { seqs_[s].tokens.push_back(token); }

void Scheduler::Finish(int s) {
  Seq& q = seqs_[s];
  TANDEM_CHECK(q.state == State::kRunning && q.followers.empty());
  FreeAll(q);
  StopRunning(s);
  q.state = State::kFinished;
  ++finished_;
}

}  // namespace tandem::rollout
