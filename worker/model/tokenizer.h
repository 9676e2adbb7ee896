// CharTokenizer: the built-in character-level tokenizer for synthetic tasks.
// Vocabulary (99 ids): 0 <pad>, 1 <bos>, 2 <eos>, printable ASCII 32..126 as
// ids 3..97, '\n' as id 98. Encode() maps any other byte to '?' (id 34);
// EncodeOrError() rejects it instead, naming the byte and its position.
// Decode() skips special ids and ids outside the vocabulary.
// Saved next to the weights as tokenizer.json {"type":"char", ...}.
// Immutable; safe to share between threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

class CharTokenizer {
 public:
  static CharTokenizer Default() { return CharTokenizer(); }

  std::vector<int32_t> Encode(std::string_view text) const;
  absl::StatusOr<std::vector<int32_t>> EncodeOrError(std::string_view text) const;
  std::string Decode(std::span<const int32_t> ids) const;

  int32_t pad() const { return 0; }
  int32_t bos() const { return 1; }
  int32_t eos() const { return 2; }
  int vocab_size() const { return 99; }

  std::string ToJson() const;
  // Writes DIR/tokenizer.json (atomically).
  absl::Status Save(const std::string& dir) const;
  // Reads DIR/tokenizer.json; NotFound when absent, InvalidArgument when it
  // is not a char tokenizer matching this vocabulary.
  static absl::StatusOr<CharTokenizer> Load(const std::string& dir);
  static absl::StatusOr<CharTokenizer> FromJson(std::string_view text);

 private:
  CharTokenizer() = default;
};

}  // namespace tandem::model
