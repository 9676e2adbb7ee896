// Text data for SFT and GRPO: JSONL rows turned into token ids with the
// model's tokenizer, and the global order in which steps consume them.
//
// A row is one JSON object. Its prompt is either raw text (prompt_key;
// system_prompt, when set, is put before it followed by a blank line; with
// `chat` the text is a user turn rendered with the chat template) or chat
// messages (messages_key: [{"role", "content"}, ...], rendered with the
// model's chat template, add_generation_prompt = true; system_prompt adds a
// system turn when the messages have none). answer_key names the reference
// answer (needed for GRPO); SFT rows need a response (response_key, or the
// messages' final assistant turn, which is then not part of the prompt).
// Every other key of the row is kept as an extra field (for the reward
// service). Chat-rendered prompts are encoded without the tokenizer's own
// special tokens (the template writes them); raw prompts with them.
//
// A bad row (not JSON, not an object, a missing key, a value of the wrong
// type, an empty prompt, a line over kMaxLineBytes, an SFT sequence longer
// than max_sequence_tokens) is an error "FILE:LINE: what", or, with
// skip_bad_rows, skipped and counted. A prompt longer than
// max_prompt_tokens is dropped, or truncated to its last max_prompt_tokens
// tokens (the generation prompt stays), and counted either way.
//
// Order: flat position f (step-major: GRPO prompt p of step s is
// (s - 1) * prompts_per_step + p) is row DataOrder(seed, n, shuffle, f) in
// epoch f / n: a seeded permutation of the rows per epoch (the identity
// without shuffle). It is the same for every world size; a rank takes its
// slice of each step's positions, and a checkpoint records the cursor.
// TextDataset is immutable after loading and thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/text/text_tokenizer.h"

namespace tandem::rl {

struct TextDataOptions {
  std::string prompt_key;
  std::string messages_key;
  std::string answer_key;    // required for RL rows
  std::string response_key;  // SFT; "" with messages: the last assistant turn
  std::string system_prompt;
  bool chat = false;               // prompt_key text as a user turn (chat template)
  bool need_answer = false;        // rows must have answer_key
  bool need_response = false;      // rows must have a response (SFT)
  int max_prompt_tokens = 0;       // 0 = no limit
  bool truncate_overflow = false;  // else drop
  bool skip_bad_rows = false;
  int max_sequence_tokens = 0;       // SFT: prompt + response + eos; 0 = no limit
  std::string field = "data.train";  // named in errors about the file itself
};

struct TextRow {
  int64_t line = 0;    // 1-based line in the file
  std::string prompt;  // the prompt text (rendered)
  std::vector<int32_t> prompt_ids;
  std::string answer;
  std::string response;                       // SFT
  std::vector<int32_t> response_ids;          // SFT (no eos)
  std::map<std::string, std::string> fields;  // the row's other keys
};

struct TextDataStats {
  int64_t rows = 0;  // rows kept
  int64_t bad_rows_skipped = 0;
  int64_t prompts_dropped = 0;
  int64_t prompts_truncated = 0;
  std::string first_bad_row;  // message of the first skipped row
};

class TextDataset {
 public:
  // Errors: NotFound for a missing file, InvalidArgument "PATH:LINE: what"
  // for a bad row, InvalidArgument when no row is left.
  static absl::StatusOr<TextDataset> Load(const std::string& path, const TextDataOptions& options,
                                          const text::Tokenizer& tokenizer);
  static absl::StatusOr<TextDataset> FromText(std::string_view text, std::string_view name,
                                              const TextDataOptions& options, const text::Tokenizer& tokenizer);

  const std::vector<TextRow>& rows() const { return rows_; }
  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  const TextDataStats& stats() const { return stats_; }

 private:
  std::vector<TextRow> rows_;
  TextDataStats stats_;
};

// Row of flat position `flat` over n rows (see the order above).
uint64_t DataOrder(uint64_t seed, uint64_t n, bool shuffle, uint64_t flat);

struct DataCursor {
  int64_t epoch = 0;
  int64_t position = 0;  // within the epoch
};
// Where flat position `flat` falls: epoch flat / n, position flat % n.
DataCursor CursorAt(uint64_t flat, uint64_t n);

}  // namespace tandem::rl
