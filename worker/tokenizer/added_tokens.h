// AddedTokenMatcher: finds added tokens (special tokens such as
// <|im_start|>, and user-added ones) in text before pre-tokenization, as
// Hugging Face tokenizers does: leftmost match first, the longest token at
// that position; lstrip / rstrip tokens take the White_Space next to them.
// Immutable after building; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tandem::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher();

  // Matches `text` as added token `index` (of the list given to Split).
  // When two tokens have the same text the first one added wins.
  void Add(std::string_view text, int index);
  bool empty() const { return nodes_.size() == 1; }

  // Cuts `text` into stretches: on_text(start, end) for text between tokens
  // (never empty), on_token(index, start, end) for each token found.
  void Split(std::string_view text, const std::vector<AddedToken>& tokens,
             absl::FunctionRef<void(size_t, size_t)> on_text,
             absl::FunctionRef<void(int, size_t, size_t)> on_token) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };
  // Longest token starting at text[pos]: its index and length, or -1.
  int LongestAt(std::string_view text, size_t pos, size_t* len) const;

  std::vector<Node> nodes_;
  std::array<int32_t, 256> root_{};  // child of the root per first byte, -1 if none
};

}  // namespace tandem::tokenizer
