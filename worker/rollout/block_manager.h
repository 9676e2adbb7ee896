// BlockManager: the bookkeeping of a paged KV cache (host side only).
//
// The cache is num_blocks fixed-size blocks of block_size positions. A
// sequence owns a block table (block ids in position order); a block may sit
// in several tables (a shared prompt prefix) and carries a reference count.
// Free blocks sit on a LIFO free list. Writing a position into a block that
// another table also references copies it first (copy-on-write): Prepare
// returns the copies the caller must apply to the device pools before the
// write. An entry of -1 is a released block (ReleaseRange). Not
// thread-safe; one scheduler owns it.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::rollout {

using BlockTable = std::vector<int32_t>;

struct BlockCopy {
  int32_t src;
  int32_t dst;
  int pool = 0;  // which block pool (Scheduler, "Two pools")
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int used_blocks() const { return num_blocks_ - free_blocks(); }
  int peak_used_blocks() const { return peak_used_; }
  int ref_count(int32_t block) const { return refs_[block]; }
  // Blocks that positions [0, n) span.
  int BlocksFor(int64_t n) const { return static_cast<int>((n + block_size_ - 1) / block_size_); }

  // Blocks a table needs (new blocks, plus a copy when the first written
  // block is shared) before positions [from, to) can be written.
  int BlocksNeeded(const BlockTable& table, int from, int to) const;
  // Makes positions [from, to) of `table` writable: appends fresh blocks and
  // replaces a shared block holding `from` by a private copy (appended to
  // `copies`). Positions before `from` must already be covered. False (and
  // nothing changed) when the free list is too short.
  bool Prepare(BlockTable& table, int from, int to, std::vector<BlockCopy>* copies);
  // A new table sharing the first `n_blocks` blocks of `table` (references
  // taken; released entries stay released).
  BlockTable Fork(const BlockTable& table, int n_blocks);
  // Drops every reference of `table` and clears it.
  void Free(BlockTable& table);
  // Drops the references of entries [from, to) and marks them released
  // (-1): positions no attention reads any more (sliding windows; the
  // blocks of attention sinks, before `from`, stay). The table keeps its
  // length, so later positions keep their blocks.
  void ReleaseRange(BlockTable& table, int from, int to);

 private:
  int32_t Take();
  void Drop(int32_t block);

  int num_blocks_;
  int block_size_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;
  int peak_used_ = 0;
};

}  // namespace tandem::rollout
