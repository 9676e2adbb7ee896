// HfTokenizer: a Hugging Face tokenizer loaded from tokenizer.json (plus the
// optional tokenizer_config.json), encoding and decoding exactly as the
// Hugging Face `tokenizers` library does for what it supports: BPE models,
// byte-level (GPT-2, Llama 3, Qwen2/2.5/3) and SentencePiece-style (Llama 2,
// Mistral: Prepend/Replace normalizers or Metaspace, byte fallback). What
// it reads and what it refuses is listed in docs/tokenizers.md; anything
// else in the files is refused when loading, with an error naming its JSON
// path, never ignored.
//
// Immutable after loading (apart from an internal cache of merged words):
// Encode and Decode may run concurrently from any number of threads.
// Move-only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::tokenizer {

class HfTokenizer {
 public:
  // Reads DIR/tokenizer.json, DIR/tokenizer_config.json when present, and
  // DIR/chat_template.jinja when present (it then replaces the config's
  // chat_template, as transformers does).
  static absl::StatusOr<HfTokenizer> LoadDir(const std::string& dir);
  // config_json may be empty (no tokenizer_config.json).
  static absl::StatusOr<HfTokenizer> FromJson(std::string_view tokenizer_json, std::string_view config_json = {});

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  ~HfTokenizer();

  // Token ids of `text`; with add_special_tokens, what the post-processor
  // adds (e.g. Llama 2's <s>). Text that is not valid UTF-8 is first
  // repaired (each maximal invalid subsequence becomes U+FFFD).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids`. Ids no token has are skipped, as are special tokens when
  // skip_special_tokens. Applies clean_up_tokenization_spaces when the
  // config sets it.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // Whether some token has this id.
  bool IsKnownId(int32_t id) const;
  // Added tokens marked special, and the config's additional_special_tokens.
  bool IsSpecial(int32_t id) const;
  // Largest token id plus one (ids below it may be unused).
  int32_t vocab_size() const;

  // From tokenizer_config.json (bos_token, eos_token, ...); nullopt when the
  // config does not name one.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  std::optional<int32_t> unk_id() const;

  // The chat template (Jinja source; "" when there is none). A config with
  // named templates gives the one named "default" here, all of them in
  // chat_templates().
  const std::string& chat_template() const;
  const std::map<std::string, std::string>& chat_templates() const;

 private:
  friend class StreamingDecoder;
  struct Impl;
  explicit HfTokenizer(std::unique_ptr<Impl> impl);

  // Decode without clean_up_tokenization_spaces.
  std::string DecodeRaw(std::span<const int32_t> ids, bool skip_special_tokens) const;
  bool clean_up_spaces() const;
  bool decoder_has_byte_fallback() const;
  bool IsByteFallbackToken(int32_t id) const;

  std::unique_ptr<Impl> impl_;
};

// Applies transformers' clean_up_tokenization: " ." -> ".", " ?" -> "?",
// " !" -> "!", " ," -> ",", " ' " -> "'", " n't" -> "n't", " 'm" -> "'m",
// " 's" -> "'s", " 've" -> "'ve", " 're" -> "'re", in that order.
std::string CleanUpTokenizationSpaces(std::string_view text);

}  // namespace tandem::tokenizer
