// WordCache: a bounded map from a pre-tokenized word to its BPE ids, shared
// by the threads that encode with one tokenizer. Sharded; a lookup or insert
// that would wait for a shard held by another thread is skipped instead (the
// word is then merged again), so the cache never makes encoding wait. A full
// shard is emptied before the next insert.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"

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
  static constexpr size_t kShards = 16;
  using Ids = absl::InlinedVector<int32_t, 6>;
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, Ids> map ABSL_GUARDED_BY(mu);
  };
  static size_t ShardOf(std::string_view word);

  size_t shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace tandem::tokenizer
