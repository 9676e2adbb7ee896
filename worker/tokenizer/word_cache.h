// WordCache: a bounded map from a pre-tokenized word to its BPE ids, shared
// by the threads that encode with one tokenizer. Sharded; each shard has a
// lock that is only ever tried: a lookup or insert that finds its shard held
// by another thread is skipped (the word is then merged again), so the cache
// never makes encoding wait, and an uncontended lookup costs one atomic
// exchange. A full shard is emptied before the next insert.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"

namespace tandem::tokenizer {

class WordCache {
 public:
  // Words longer than this are not cached.
  static constexpr size_t kMaxWordBytes = 256;

  explicit WordCache(size_t capacity);
  WordCache(const WordCache&) = delete;
  WordCache& operator=(const WordCache&) = delete;

  // Appends the cached ids of `word` to *ids; false on a miss.
  bool Lookup(std::string_view word, std::vector<int32_t>* ids) const;
  void Insert(std::string_view word, std::span<const int32_t> ids) const;

 private:
  static constexpr size_t kShards = 64;
  using Ids = absl::InlinedVector<int32_t, 6>;
  // `map` is only touched by the thread whose TryLock() succeeded.
  struct alignas(64) Shard {
    bool TryLock() { return !held.exchange(true, std::memory_order_acquire); }
    void Unlock() { held.store(false, std::memory_order_release); }
    std::atomic<bool> held{false};
    absl::flat_hash_map<std::string, Ids> map;
  };
  static size_t ShardOf(std::string_view word);

  size_t shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace tandem::tokenizer
