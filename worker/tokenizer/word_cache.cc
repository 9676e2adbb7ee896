#include "worker/tokenizer/word_cache.h"

#include <algorithm>

namespace tandem::tokenizer {

WordCache::WordCache(size_t capacity) : shard_capacity_(std::max<size_t>(1, capacity / kShards)) {}

size_t WordCache::ShardOf(std::string_view word) {
  // FNV-1a over at most the first and last 8 bytes: cheap and spread enough.
  uint64_t h = 1469598103934665603ULL ^ word.size();
  const size_t n = std::min<size_t>(word.size(), 8);
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(word[i])) * 1099511628211ULL;
  for (size_t i = word.size() - n; i < word.size(); ++i) {
    h = (h ^ static_cast<unsigned char>(word[i])) * 1099511628211ULL;
  }
  return static_cast<size_t>(h >> 32) % kShards;
}

bool WordCache::Lookup(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.size() > kMaxWordBytes) return false;
  Shard& shard = shards_[ShardOf(word)];
  if (!shard.TryLock()) return false;
  bool hit = false;
  if (auto it = shard.map.find(absl::string_view(word.data(), word.size())); it != shard.map.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    hit = true;
  }
  shard.Unlock();
  return hit;
}

void WordCache::Insert(std::string_view word, std::span<const int32_t> ids) const {
  if (word.size() > kMaxWordBytes) return;
  Shard& shard = shards_[ShardOf(word)];
  if (!shard.TryLock()) return;
  if (shard.map.size() >= shard_capacity_) shard.map.clear();
  shard.map.try_emplace(std::string(word), Ids(ids.begin(), ids.end()));
  shard.Unlock();
}

}  // namespace tandem::tokenizer
