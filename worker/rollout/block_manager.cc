#include "worker/rollout/block_manager.h"

#include <algorithm>

#include "common/base/check.h"

namespace tandem::rollout {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), refs_(num_blocks, 0) {
  TANDEM_CHECK(num_blocks >= 0 && block_size > 0);
  free_.reserve(num_blocks);
  // LIFO: block 0 is handed out first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockManager::Take() {
  TANDEM_CHECK(!free_.empty());
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  if (used_blocks() > peak_used_) peak_used_ = used_blocks();
  return b;
}

void BlockManager::Drop(int32_t b) {
  TANDEM_CHECK(b >= 0 && b < num_blocks_ && refs_[b] > 0);
  if (--refs_[b] == 0) free_.push_back(b);
}

int BlockManager::BlocksNeeded(const BlockTable& table, int from, int to) const {
  if (to <= from) return 0;
  const int have = static_cast<int>(table.size());
  int need = std::max(0, BlocksFor(to) - have);
  const int first = from / block_size_;
  if (first < have && refs_[table[first]] > 1) ++need;
  return need;
}

bool BlockManager::Prepare(BlockTable& table, int from, int to, std::vector<BlockCopy>* copies) {
  if (to <= from) return true;
  TANDEM_CHECK(BlocksFor(from) <= static_cast<int>(table.size()) || from % block_size_ == 0);
  if (BlocksNeeded(table, from, to) > free_blocks()) return false;
  const int first = from / block_size_;
  if (first < static_cast<int>(table.size()) && refs_[table[first]] > 1) {
    const int32_t dst = Take();
    copies->push_back({table[first], dst});
    Drop(table[first]);
    table[first] = dst;
  }
  while (static_cast<int>(table.size()) < BlocksFor(to)) table.push_back(Take());
  return true;
}

BlockTable BlockManager::Fork(const BlockTable& table, int n_blocks) {
  TANDEM_CHECK(n_blocks <= static_cast<int>(table.size()));
  BlockTable out(table.begin(), table.begin() + n_blocks);
  for (int32_t b : out) {
    if (b >= 0) ++refs_[b];
  }
  return out;
}

void BlockManager::Free(BlockTable& table) {
  for (int32_t b : table) {
    if (b >= 0) Drop(b);
  }
  table.clear();
}

void BlockManager::ReleaseRange(BlockTable& table, int from, int to) {
  to = std::min<int>(to, static_cast<int>(table.size()));
  for (int i = std::max(from, 0); i < to; ++i) {
    if (table[i] < 0) continue;
    Drop(table[i]);
    table[i] = -1;
  }
}

}  // namespace tandem::rollout
