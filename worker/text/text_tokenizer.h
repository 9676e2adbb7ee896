// text::Tokenizer: what the engine needs of a tokenizer (encode, decode,
// streaming decode, special ids, vocabulary size, chat template), with two
// implementations: the built-in CharTokenizer (synthetic tasks) and a
// Hugging Face tokenizer (tokenizer.json, tokenizer_config.json and its
// chat template).
//
// Immutable after creation: every method may be called from any thread.
// A StreamDecoder is one generation stream and is not thread-safe; the
// tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/tokenizer.h"

namespace tandem::text {

class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  // Text that became final with this id (often "").
  virtual std::string Add(int32_t id) = 0;
  // Everything still held back.
  virtual std::string Flush() = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "char" or "hf".
  virtual std::string_view kind() const = 0;
  // Ids of `text`. add_special_tokens: what the tokenizer's post-processor
  // adds (Llama's bos); the char tokenizer adds nothing. The char tokenizer
  // fails on a character it cannot encode, naming it.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Text of `ids`; special tokens are left out when skip_special_tokens.
  virtual std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  virtual std::unique_ptr<StreamDecoder> NewStreamDecoder(bool skip_special_tokens) const = 0;

  virtual std::optional<int32_t> bos() const = 0;
  virtual std::optional<int32_t> eos() const = 0;
  virtual std::optional<int32_t> pad() const = 0;
  // Largest id plus one.
  virtual int vocab_size() const = 0;

  // Whether ApplyChatTemplate can work (a Hugging Face tokenizer with a
  // chat template).
  virtual bool has_chat_template() const { return false; }
  // The prompt text of `messages` (a JSON array of {role, content}) as the
  // model's chat template renders it (transformers' apply_chat_template with
  // tokenize=False). FailedPrecondition without a chat template.
  virtual absl::StatusOr<std::string> ApplyChatTemplate(const nlohmann::ordered_json& messages,
                                                        bool add_generation_prompt) const;

  // Writes the tokenizer's files into `dir` (char: tokenizer.json; Hugging
  // Face: copies of the files it was loaded from).
  virtual absl::Status SaveTo(const std::string& dir) const = 0;
};

// The built-in character tokenizer behind the interface.
std::shared_ptr<const Tokenizer> MakeCharTokenizer();

// DIR/tokenizer.json (and tokenizer_config.json, chat_template.jinja when
// present) as a Hugging Face tokenizer. The chat template is parsed here,
// so a template outside the supported subset fails at load.
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadHfTokenizer(const std::string& dir);

// The tokenizer of a model directory: DIR/tokenizer.json of type "char" is
// the built-in tokenizer, anything else a Hugging Face one. NotFound when
// DIR has no tokenizer.json.
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadModelTokenizer(const std::string& dir);

// The ids generation should stop at for a model directory: the eos ids of
// DIR/generation_config.json ("eos_token_id": an int or a list), empty when
// the file is absent. InvalidArgument for a malformed file.
absl::StatusOr<std::vector<int32_t>> GenerationConfigEosIds(const std::string& dir);

// The files a Hugging Face tokenizer directory may hold, in the order they
// are copied.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                                  "chat_template.json", "special_tokens_map.json"};

// Copies the tokenizer files of `from` that exist into `to` (creating it).
absl::Status CopyTokenizerFiles(const std::string& from, const std::string& to);

}  // namespace tandem::text
