// Scheduler: continuous batching over a paged KV cache (host side only).
//
// Each step takes up to max_batch_tokens rows: first one decode row for
// every running sequence whose cache is complete, then prefill chunks of
// running sequences (oldest first), then new sequences from the waiting
// queue (first in, first out) while the free blocks cover their first chunk
// and fewer than max_seqs run. A sequence that finishes frees its blocks at
// once, so the next step can admit another.
//
// When a running sequence needs a block and none is free, the newest
// running sequence is preempted: its blocks are freed and it goes back to
// the front of the queue with its tokens so far, to be recomputed later
// (its sampled tokens do not change: the sampler's draws are keyed by token
// index). Only a sequence that alone needs more blocks than the cache holds
// is an error (Add).
//
// Shared prompts: sequences added with the same group id have the same
// prompt. When one of them is admitted, the others that wait with no tokens
// generated attach to it; when its prompt is complete they fork its block
// table (reference counts), skip their own prefill and sample their first
// token from the same logits row. The first write into a partly filled
// shared block copies it (copy-on-write; Step::copies). A sample admitted
// while a sibling of its group still holds the prompt's blocks (it waited
// past max_seqs, or was preempted) forks them and recomputes only its
// generated tokens, or, with none yet, the prompt's last position (whose
// logits give its first token), as a prefix-cache hit does.
//
// Recurrent state (state_slots > 0, models with linear-attention layers):
// every running sequence holds one of state_slots slots (state_slot), taken
// when it starts running and given back when it finishes or is preempted;
// a follower's slot receives its leader's state at the fork (Step::forks,
// after the forward). A preempted sample recomputes from position 0: its
// group's blocks hold the prompt's k/v but no sibling holds the state at
// the prompt's end.
//
// Sliding windows (window > 0: every KV layer attends at most `window`
// positions back): after each step a sequence gives back the blocks that
// lie wholly before its next position's window, so its cache stays bounded
// (about window / block_size + 2 blocks) however long it grows; with
// attention sinks (sinks > 0) the blocks of its first `sinks` positions
// stay as well. A
// sample admitted late forks a running sibling's prompt only while that
// sibling still holds the blocks of the window its first position reads;
// otherwise it recomputes from position 0.
//
// Two pools (windowed.num_blocks > 0: a model with full-attention layers
// and windowed ones): every sequence holds one block table per pool, of the
// same length. The first pool serves the full layers and keeps every block;
// the second serves the windowed layers and gives blocks back behind
// windowed.window (keeping windowed.sinks positions' blocks). A step's rows
// take blocks in both pools at once; a sequence that cannot get them in
// either preempts as above, and the copies of copy-on-write name their
// pool.
//
// Static batches (static_batch): new sequences are admitted only when none
// runs, so a batch drains completely before the next starts (the baseline
// of a static-batch generator, for benchmarks).
//
// Not thread-safe; the engine's thread owns it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/rollout/block_manager.h"

namespace tandem::rollout {

// A second block pool (Scheduler, "Two pools").
struct WindowedPoolOptions {
  int num_blocks = 0;  // 0: one pool
  int window = 0;
  int sinks = 0;
};

struct SchedulerOptions {
  int num_blocks = 0;
  int block_size = 16;
  int max_batch_tokens = 512;  // rows per step
  int max_seqs = 256;          // running sequences (attached ones included)
  bool share_prompts = true;
  bool static_batch = false;     // admit only when nothing runs
  int state_slots = 0;           // recurrent states (>= min(max_seqs, sequences added) when used)
  int window = 0;                // > 0: blocks before every KV layer's window are given back
  int sinks = 0;                 // with window: the first `sinks` positions' blocks stay
  WindowedPoolOptions windowed;  // with num_blocks > 0, window above must be 0
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;       // prompt positions computed
  int64_t recomputed_tokens = 0;    // positions computed again after a preemption
  int64_t prompt_tokens_saved = 0;  // prompt positions forked instead of computed
  int64_t preemptions = 0;
  int64_t cow_copies = 0;
  int max_running = 0;
};

class Scheduler {
 public:
  // positions [start, start + n) of sequence seq, in this step's rows
  // [row, row + n).
  struct Chunk {
    int seq;
    int start;
    int n;
    int row;
  };
  // Sample the next token of `seq` from the logits of step row `row`.
  struct Sample {
    int seq;
    int row;
  };
  struct Step {
    std::vector<Chunk> chunks;
    std::vector<BlockCopy> copies;  // apply before the forward
    std::vector<Sample> samples;
    std::vector<std::pair<int, int>> forks;  // (follower, leader) at Commit
    int rows = 0;
    void Clear() {
      chunks.clear();
      copies.clear();
      samples.clear();
      forks.clear();
      rows = 0;
    }
  };

  explicit Scheduler(const SchedulerOptions& options);

  // Queues a sequence that may grow to prompt + max_new_tokens positions;
  // returns its id (0, 1, ...). group >= 0: sequences of one group have
  // equal prompts. InvalidArgument when it could never fit in the cache.
  absl::StatusOr<int> Add(std::vector<int32_t> prompt, int group, int max_new_tokens);

  // Plans the next step into *step; false when every sequence has finished.
  bool Schedule(Step* step);
  // After the step's forward: marks its positions computed and forks the
  // followers of completed shared prompts.
  void Commit(const Step& step);
  // Appends a sampled token (after Commit).
  void Append(int seq, int32_t token);
  // Ends a sequence and frees its blocks.
  void Finish(int seq);

  std::span<const int32_t> tokens(int seq) const { return seqs_[seq].tokens; }
  int prompt_len(int seq) const { return seqs_[seq].prompt_len; }
  int generated(int seq) const { return static_cast<int>(seqs_[seq].tokens.size()) - seqs_[seq].prompt_len; }
  const BlockTable& table(int seq, int pool = 0) const { return seqs_[seq].tables[pool]; }
  // The recurrent-state slot of a running sequence (-1 without slots).
  int state_slot(int seq) const { return seqs_[seq].slot; }
  int max_blocks_per_seq() const { return max_blocks_; }
  int max_positions() const { return max_positions_; }
  int num_pools() const { return static_cast<int>(pools_.size()); }
  const BlockManager& blocks(int pool = 0) const { return pools_[pool].blocks; }
  const SchedulerStats& stats() const { return stats_; }
  int num_seqs() const { return static_cast<int>(seqs_.size()); }

 private:
  enum class State { kWaiting, kAttached, kRunning, kFinished };
  struct Seq {
    std::vector<int32_t> tokens;  // prompt ++ generated
    int prompt_len = 0;
    int group = -1;
    int computed = 0;    // positions whose k/v are cached
    int high_water = 0;  // positions ever computed (recompute accounting)
    State state = State::kWaiting;
    std::array<BlockTable, 2> tables;  // one per pool
    std::vector<int> followers;        // attached sequences (leader only)
    int slot = -1;                     // recurrent-state slot while running
  };

  // Makes room for positions [from, to) of seq, preempting newer running
  // sequences; false when seq itself was preempted.
  bool Reserve(int seq, int from, int to, Step* step);
  void Preempt(int seq);
  void Plan(int seq, int n, Step* step);
  // A running sequence of seq's group whose prompt k/v are cached (with
  // windows: the blocks seq's first position reads), or -1.
  int PromptDonor(int seq) const;
  int Active() const;
  struct Pool {
    BlockManager blocks;
    int window;  // > 0: blocks behind it are given back
    int sinks;   // with window: the first `sinks` positions' blocks stay
    // Blocks holding the attention sinks' positions.
    int SinkBlocks() const { return window > 0 ? (sinks + blocks.block_size() - 1) / blocks.block_size() : 0; }
    // Free blocks kept back when admitting beside running sequences.
    int Watermark() const { return std::max(1, blocks.num_blocks() / 100); }
  };
  bool AnyWindow() const;
  // Whether every pool has the blocks positions [from, to) of seq need.
  bool CanPrepare(const Seq& q, int from, int to) const;
  // Prepares positions [from, to) of seq in every pool (copies name their
  // pool); false, with nothing changed, when a pool is short.
  bool PrepareAll(Seq& q, int from, int to, std::vector<BlockCopy>* copies);
  void FreeAll(Seq& q);
  // q's tables share the first blocks of `from`'s that cover n positions.
  void ForkAll(Seq& q, const Seq& from, int n);
  // Marks seq running (with a state slot when slots are used) / takes it
  // out of running_ (giving its slot back).
  void StartRunning(int seq);
  void StopRunning(int seq);

  SchedulerOptions opt_;
  std::vector<Pool> pools_;  // 1 or 2
  std::vector<Seq> seqs_;
  std::vector<int> running_;  // admission order (newest last)
  std::deque<int> waiting_;
  std::vector<int> free_slots_;
  int max_blocks_ = 0;
  int max_positions_ = 0;
  int finished_ = 0;
  SchedulerStats stats_;
};

}  // namespace tandem::rollout
