// SFT data: examples from a built-in task or a JSONL file, a deterministic
// global batch per step, the rank slice of it, micro-batches, and packing.
//
// JSONL: one object per line, one of these forms (blank lines are skipped,
// unknown keys are an error):
//   {"prompt": "...", "completion": "..."}     loss on the completion
//   {"text": "..."}                            loss on every token
//   {"prompt_ids": [..], "completion_ids": [..]}
//   {"ids": [..]}                              loss on every token
// Text is encoded with the char tokenizer (printable ASCII and '\n' only).
// Lines longer than kMaxLineBytes are rejected without being read whole.
// Errors name the file and line: "data.jsonl:7: ...".
//
// A packed sequence is [prefix] [bos] prompt completion [eos] (no bos when bos < 0). targets[j] is the next
// token; loss_mask[j] = 1 where targets[j] is a completion token or the final
// eos; the last position of each sequence has target 0 and mask 0.
//
// Determinism: example i (0 <= i < G) of step s is a pure function of
// (seed, s, i): a task draws Sample(seed, s * G + i); a file walks a seeded
// permutation of its lines per epoch over the flat position s * G + i. Rank r
// of N takes RankSlice(G, r, N) of that list, so the union over ranks is the
// same for every N, and every rank can count the step's loss tokens
// (CountLossTokens over GlobalBatch) without communication.
// SftDataset is immutable after creation and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/tokenizer.h"
#include "worker/rl/tasks.h"

namespace tandem::rl {

inline constexpr size_t kMaxLineBytes = 1 << 20;

struct SftExample {
  std::vector<int32_t> prompt_ids;      // no bos
  std::vector<int32_t> completion_ids;  // no eos
};

// Model-side facts the loader checks ids against.
struct SftTokens {
  int32_t bos = 1;  // -1: none (the prompt ids carry the tokenizer's own)
  int32_t eos = 2;
  int vocab_size = 99;
  int seq_len = 0;  // max tokens per packed sequence incl. bos/eos; 0 = no limit
};

class SftDataset {
 public:
  // Built-in task; needs the char tokenizer. Fails when the task's longest
  // example does not fit in tokens.seq_len.
  static absl::StatusOr<SftDataset> FromTask(std::shared_ptr<const Task> task, const model::CharTokenizer& tok,
                                             const SftTokens& tokens, uint64_t seed);
  // JSONL file. `tok` may be null (a model without the char tokenizer): text
  // forms are then rejected and only id forms accepted.
  static absl::StatusOr<SftDataset> FromJsonlFile(const std::string& path, const model::CharTokenizer* tok,
                                                  const SftTokens& tokens, uint64_t seed);
  // Same, from JSONL text in memory; `name` is used in error messages.
  static absl::StatusOr<SftDataset> FromJsonlText(std::string_view text, std::string_view name,
                                                  const model::CharTokenizer* tok, const SftTokens& tokens,
                                                  uint64_t seed);

  // Examples already tokenized (text data, worker/rl/text_data.h). With
  // shuffle false the order is the rows' own, epoch after epoch.
  static absl::StatusOr<SftDataset> FromExamples(std::vector<SftExample> examples, const SftTokens& tokens,
                                                 uint64_t seed, bool shuffle);
  // Example i of step `step`'s global batch of size global_batch.
  SftExample Get(int64_t step, int64_t i, int64_t global_batch) const;
  // Examples [range_begin, range_end) of the step's global batch.
  std::vector<SftExample> Batch(int64_t step, int64_t global_batch, int64_t range_begin, int64_t range_end) const;
  std::vector<SftExample> GlobalBatch(int64_t step, int64_t global_batch) const {
    return Batch(step, global_batch, 0, global_batch);
  }
  // Line index (file) or sample index (task) behind Get(step, i, G).
  uint64_t SourceIndex(int64_t step, int64_t i, int64_t global_batch) const;

  // Examples in the file; 0 for a task (unbounded).
  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  const SftTokens& tokens() const { return tokens_; }

 private:
  SftDataset() = default;
  std::shared_ptr<const Task> task_;
  std::optional<model::CharTokenizer> tok_;
  std::vector<SftExample> examples_;
  SftTokens tokens_;
  uint64_t seed_ = 0;
  bool shuffle_ = true;
};

// Position j of epoch `epoch`'s seeded permutation of [0, n) (O(1) memory).
uint64_t EpochPermute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t j);

// Index range [begin, end).
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const IndexRange&) const = default;
};

// Rank r of n takes [r*total/n, (r+1)*total/n) (uneven sizes allowed).
IndexRange RankSlice(int64_t total, int rank, int world);
// Splits `range` into consecutive chunks of at most micro_batch items.
std::vector<IndexRange> MicroBatches(IndexRange range, int64_t micro_batch);
// Tokens with loss: completion tokens plus the eos, summed over examples.
int64_t CountLossTokens(std::span<const SftExample> examples);

// Sequences packed back to back (no padding).
struct PackedBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  std::vector<int32_t> positions;   // restart at 0 in every sequence
  std::vector<int32_t> cu_seqlens;  // num_sequences + 1 offsets into tokens
  std::vector<float> loss_mask;
  int num_sequences = 0;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int max_seqlen() const;
};

// `prefix` (a soft prompt's ids, model/soft_prompt.h) starts every
// sequence, before the bos, with no loss on it.
PackedBatch PackSft(std::span<const SftExample> examples, int32_t bos, int32_t eos,
                    std::span<const int32_t> prefix = {});

}  // namespace tandem::rl
