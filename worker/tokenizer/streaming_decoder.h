// StreamingDecoder: text of generated ids as they come, one id at a time.
// Add() returns only text that no later id can change: an incomplete UTF-8
// sequence (a trailing U+FFFD), a run of <0xNN> byte tokens that may still
// grow, and trailing text that transformers' clean-up could still rewrite
// (" ." -> ".") are held back until they are settled or Flush() is called.
// The concatenation of every Add() and the final Flush() equals
// HfTokenizer::Decode of all the ids, and each piece is valid UTF-8.
//
// Keeps a window of the last few ids (decoding starts over on it), so each
// Add costs a decode of a bounded number of tokens. One generation stream
// per object; not thread-safe. The tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/tokenizer/hf_tokenizer.h"

namespace tandem::tokenizer {

class StreamingDecoder {
 public:
  explicit StreamingDecoder(const HfTokenizer& tokenizer, bool skip_special_tokens = false);

  // The text that became final with this id (often "", never broken UTF-8).
  std::string Add(int32_t id);
  // Everything still held back; the decoder is then ready for a new stream.
  std::string Flush();

 private:
  // Passes settled raw text through the clean-up stage.
  std::string CleanUp(std::string raw, bool final);

  const HfTokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> window_;  // context ids, then ids not yet final
  size_t emitted_ = 0;           // bytes of the window's text already passed on
  std::string pending_;          // settled text the clean-up may still rewrite
};

}  // namespace tandem::tokenizer
