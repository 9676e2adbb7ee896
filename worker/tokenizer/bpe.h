// BpeModel: the tokenizer.json "model" of type BPE. Vocabulary and merges
// (as "a b" strings or ["a", "b"] pairs) are checked when loading: ids must
// be unique integers in [0, kMaxTokenId], every merge must name vocabulary
// tokens whose concatenation is one too. Encoding a word follows Hugging
// Face tokenizers: characters (with continuing_subword_prefix /
// end_of_word_suffix), byte fallback to <0xNN> tokens or the unk token
// (fused when fuse_unk), then merges applied lowest rank first, leftmost
// first; ignore_merges takes a word that is itself a token as is. Merged
// words are cached (WordCache). Immutable after loading apart from the
// cache; Encode is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/word_cache.h"

namespace tandem::tokenizer {

// Largest token id a tokenizer.json may use.
inline constexpr int64_t kMaxTokenId = (1 << 24) - 1;

class BpeModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const Json& j, const std::string& path);

  // Appends the ids of one pre-tokenized word to *ids.
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when no vocabulary token has this id.
  const std::string* IdToToken(int32_t id) const;
  // Largest id in the vocabulary plus one.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t size() const { return vocab_.size(); }

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  struct QueuedMerge {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  struct Scratch {
    std::vector<Symbol> symbols;
    std::vector<QueuedMerge> heap;
    std::string piece;
  };

  BpeModel() : cache_(1 << 16) {}
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const MergeInfo* FindMerge(int32_t a, int32_t b) const;
  std::optional<int32_t> CharId(std::string_view ch) const;
  void InitialSymbols(std::string_view word, Scratch* s) const;
  void MergeAll(Scratch* s) const;

  std::vector<std::string> id_to_token_;                  // "" where no token has the id
  absl::flat_hash_map<std::string_view, int32_t> vocab_;  // views into id_to_token_
  absl::flat_hash_map<uint64_t, MergeInfo> merges_;
  int32_t ascii_ids_[128];  // single-byte characters, -1 when absent
  int32_t byte_fallback_ids_[256];
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  WordCache cache_;
};

}  // namespace tandem::tokenizer
