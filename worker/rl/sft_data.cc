// SFT data: see sft_data.h.
#include "worker/rl/sft_data.h"

#include <algorithm>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/strict_json.h"
#include "worker/rl/counter_rng.h"

namespace tandem::rl {
namespace {

constexpr uint64_t kPermStream = 0x7065726dULL;  // "perm"

// Bijection on [0, 2^(2*half_bits)): a 4-round Feistel network keyed by key.
uint64_t Feistel(uint64_t x, int half_bits, uint64_t key) {
  const uint64_t mask = (uint64_t{1} << half_bits) - 1;
  uint64_t left = x >> half_bits;
  uint64_t right = x & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t next = left ^ (Mix(key, right, round) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits) | right;
}

// Position j of a seeded permutation of [0, n), O(1) memory: Feistel on the
// smallest even power of two >= n, with cycle walking back into [0, n).
uint64_t Permute(uint64_t j, uint64_t n, uint64_t key) {
  int bits = 2;
  while ((uint64_t{1} << bits) < n) bits += 2;
  uint64_t x = j;
  do {
    x = Feistel(x, bits / 2, key);
  } while (x >= n);
  return x;
}

// absl::StrCat takes absl::string_view, which Debian's Abseil keeps distinct
// from std::string_view: convert through Sv().
absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

std::string Where(std::string_view name, int64_t line) { return absl::StrCat(Sv(name), ":", line, ": "); }

absl::StatusOr<std::vector<int32_t>> ParseIds(const nlohmann::json& value, std::string_view key,
                                              const SftTokens& tokens) {
  if (!value.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", Sv(key), "\" must be an array of token ids, got ", value.type_name()));
  }
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& v = value[i];
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", Sv(key), "\"[", i, "] must be an integer, got ", v.type_name()));
    }
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= tokens.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", Sv(key), "\"[", i, "] = ", id, " is outside the vocabulary [0, ", tokens.vocab_size, ")"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> ParseText(const nlohmann::json& value, std::string_view key,
                                               const model::CharTokenizer* tok) {
  if (!value.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", Sv(key), "\" must be a string, got ", value.type_name()));
  }
  if (tok == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("\"", Sv(key),
                                                   "\" is text but the model has no built-in tokenizer; give token ids "
                                                   "(\"prompt_ids\"/\"completion_ids\" or \"ids\")"));
  }
  auto ids = tok->EncodeOrError(value.get_ref<const std::string&>());
  if (!ids.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", Sv(key), "\": ", ids.status().message()));
  }
  return std::move(ids).value();
}

// Parses one JSONL object into an example.
absl::StatusOr<SftExample> ParseLine(std::string_view line, const model::CharTokenizer* tok, const SftTokens& tokens) {
  // Strict: no duplicate keys, bounded nesting (a row is untrusted input).
  ASSIGN_OR_RETURN(nlohmann::json j, model::ParseStrictJson(line, "row"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "prompt" && k != "completion" && k != "text" && k != "prompt_ids" && k != "completion_ids" && k != "ids") {
      return absl::InvalidArgumentError(absl::StrCat("unknown key \"", k,
                                                     "\"; expected {\"prompt\",\"completion\"}, {\"text\"}, "
                                                     "{\"prompt_ids\",\"completion_ids\"} or {\"ids\"}"));
    }
  }
  const auto has = [&](const char* k) { return j.contains(k); };
  SftExample ex;
  if (has("prompt") || has("completion")) {
    if (!has("prompt") || !has("completion") || j.size() != 2) {
      return absl::InvalidArgumentError("the text form needs exactly \"prompt\" and \"completion\"");
    }
    ASSIGN_OR_RETURN(auto p, ParseText(j["prompt"], "prompt", tok));
    ASSIGN_OR_RETURN(auto c, ParseText(j["completion"], "completion", tok));
    ex.prompt_ids = std::move(p);
    ex.completion_ids = std::move(c);
  } else if (has("text")) {
    if (j.size() != 1) {
      return absl::InvalidArgumentError("\"text\" cannot be mixed with other keys");
    }
    ASSIGN_OR_RETURN(auto c, ParseText(j["text"], "text", tok));
    if (c.empty()) return absl::InvalidArgumentError("\"text\" is empty");
    ex.completion_ids = std::move(c);
  } else if (has("prompt_ids") || has("completion_ids")) {
    if (!has("prompt_ids") || !has("completion_ids") || j.size() != 2) {
      return absl::InvalidArgumentError("the id form needs exactly \"prompt_ids\" and \"completion_ids\"");
    }
    ASSIGN_OR_RETURN(auto p, ParseIds(j["prompt_ids"], "prompt_ids", tokens));
    ASSIGN_OR_RETURN(auto c, ParseIds(j["completion_ids"], "completion_ids", tokens));
    ex.prompt_ids = std::move(p);
    ex.completion_ids = std::move(c);
  } else if (has("ids")) {
    if (j.size() != 1) {
      return absl::InvalidArgumentError("\"ids\" cannot be mixed with other keys");
    }
    ASSIGN_OR_RETURN(auto c, ParseIds(j["ids"], "ids", tokens));
    if (c.empty()) return absl::InvalidArgumentError("\"ids\" is empty");
    ex.completion_ids = std::move(c);
  } else {
    return absl::InvalidArgumentError(
        "empty object; expected {\"prompt\",\"completion\"}, {\"text\"}, "
        "{\"prompt_ids\",\"completion_ids\"} or {\"ids\"}");
  }
  const int64_t len = 2 + static_cast<int64_t>(ex.prompt_ids.size()) + static_cast<int64_t>(ex.completion_ids.size());
  if (tokens.seq_len > 0 && len > tokens.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence of ", len,
                                                   " tokens (with bos and eos) exceeds "
                                                   "train.seq_len ",
                                                   tokens.seq_len));
  }
  return ex;
}

bool IsBlank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

absl::Status CheckTokens(const SftTokens& tokens) {
  if (tokens.vocab_size <= 0 || tokens.bos < -1 || tokens.bos >= tokens.vocab_size || tokens.eos < 0 ||
      tokens.eos >= tokens.vocab_size || tokens.seq_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid token setup: bos ", tokens.bos, ", eos ", tokens.eos,
                                                   ", vocab ", tokens.vocab_size, ", seq_len ", tokens.seq_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SftDataset> SftDataset::FromTask(std::shared_ptr<const Task> task, const model::CharTokenizer& tok,
                                                const SftTokens& tokens, uint64_t seed) {
  if (task == nullptr) return absl::InvalidArgumentError("no task given");
  RETURN_IF_ERROR(CheckTokens(tokens));
  const int longest = task->max_prompt_chars() + task->max_answer_chars() + 2;
  if (tokens.seq_len > 0 && longest > tokens.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("train.seq_len ", tokens.seq_len, " is too short for the ",
                                                   task->name(), " task: its longest example needs ", longest,
                                                   " tokens (with bos and eos)"));
  }
  SftDataset d;
  d.task_ = std::move(task);
  d.tok_ = tok;
  d.tokens_ = tokens;
  d.seed_ = seed;
  return d;
}

absl::StatusOr<SftDataset> SftDataset::FromJsonlText(std::string_view text, std::string_view name,
                                                     const model::CharTokenizer* tok, const SftTokens& tokens,
                                                     uint64_t seed) {
  RETURN_IF_ERROR(CheckTokens(tokens));
  SftDataset d;
  d.tokens_ = tokens;
  d.seed_ = seed;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    ++line_no;
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.size() > kMaxLineBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(name, line_no), "line is longer than ", kMaxLineBytes, " bytes"));
    }
    if (IsBlank(line)) continue;
    auto ex = ParseLine(line, tok, tokens);
    if (!ex.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(name, line_no), ex.status().message()));
    }
    d.examples_.push_back(std::move(*ex));
  }
  if (d.examples_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(name), ": no examples (the file is empty or blank)"));
  }
  return d;
}

absl::StatusOr<SftDataset> SftDataset::FromJsonlFile(const std::string& path, const model::CharTokenizer* tok,
                                                     const SftTokens& tokens, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open SFT data file ", path));
  }
  // Reads line by line into a bounded buffer, so an over-long line is
  // reported without being held in memory.
  std::string text;
  std::vector<char> buf(kMaxLineBytes + 2);
  int64_t line_no = 0;
  while (true) {
    in.getline(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got == 0 && in.eof()) break;
    ++line_no;
    if (in.fail() && !in.eof()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path, line_no), "line is longer than ", kMaxLineBytes, " bytes"));
    }
    // gcount includes the consumed '\n' unless at end of file.
    size_t len = static_cast<size_t>(got);
    if (!in.eof() && len > 0) --len;
    text.append(buf.data(), len);
    text.push_back('\n');
    if (in.eof()) break;
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading ", path));
  }
  return FromJsonlText(text, path, tok, tokens, seed);
}

absl::StatusOr<SftDataset> SftDataset::FromExamples(std::vector<SftExample> examples, const SftTokens& tokens,
                                                    uint64_t seed, bool shuffle) {
  RETURN_IF_ERROR(CheckTokens(tokens));
  if (examples.empty()) return absl::InvalidArgumentError("no examples");
  SftDataset d;
  d.examples_ = std::move(examples);
  d.tokens_ = tokens;
  d.seed_ = seed;
  d.shuffle_ = shuffle;
  return d;
}

uint64_t EpochPermute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t j) {
  return Permute(j, n, Mix(seed, epoch, kPermStream));
}

uint64_t SftDataset::SourceIndex(int64_t step, int64_t i, int64_t global_batch) const {
  const uint64_t flat = static_cast<uint64_t>(step) * static_cast<uint64_t>(global_batch) + static_cast<uint64_t>(i);
  if (task_ != nullptr) return flat;
  const uint64_t n = examples_.size();
  const uint64_t epoch = flat / n;
  if (!shuffle_) return flat % n;
  return EpochPermute(seed_, epoch, n, flat % n);
}

SftExample SftDataset::Get(int64_t step, int64_t i, int64_t global_batch) const {
  const uint64_t index = SourceIndex(step, i, global_batch);
  if (task_ == nullptr) return examples_[index];
  const Example ex = task_->Sample(seed_, index);
  SftExample out;
  out.prompt_ids = tok_->Encode(ex.prompt);
  out.completion_ids = tok_->Encode(ex.answer);
  return out;
}

std::vector<SftExample> SftDataset::Batch(int64_t step, int64_t global_batch, int64_t range_begin,
                                          int64_t range_end) const {
  std::vector<SftExample> out;
  out.reserve(std::max<int64_t>(0, range_end - range_begin));
  for (int64_t i = range_begin; i < range_end; ++i) {
    out.push_back(Get(step, i, global_batch));
  }
  return out;
}

IndexRange RankSlice(int64_t total, int rank, int world) {
  return IndexRange{rank * total / world, (rank + 1) * total / world};
}

std::vector<IndexRange> MicroBatches(IndexRange range, int64_t micro_batch) {
  std::vector<IndexRange> out;
  if (micro_batch <= 0) micro_batch = std::max<int64_t>(1, range.size());
  for (int64_t b = range.begin; b < range.end; b += micro_batch) {
    out.push_back(IndexRange{b, std::min(range.end, b + micro_batch)});
  }
  return out;
}

int64_t CountLossTokens(std::span<const SftExample> examples) {
  int64_t n = 0;
  for (const SftExample& ex : examples) {
    n += static_cast<int64_t>(ex.completion_ids.size()) + 1;
  }
  return n;
}

int PackedBatch::max_seqlen() const {
  int m = 0;
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    m = std::max(m, cu_seqlens[s + 1] - cu_seqlens[s]);
  }
  return m;
}

PackedBatch PackSft(std::span<const SftExample> examples, int32_t bos, int32_t eos, std::span<const int32_t> prefix) {
  PackedBatch b;
  size_t total = 0;
  for (const SftExample& ex : examples) {
    total += prefix.size() + ex.prompt_ids.size() + ex.completion_ids.size() + 2;
  }
  b.tokens.reserve(total);
  b.targets.reserve(total);
  b.positions.reserve(total);
  b.loss_mask.reserve(total);
  b.cu_seqlens.reserve(examples.size() + 1);
  b.cu_seqlens.push_back(0);
  for (const SftExample& ex : examples) {
    const size_t start = b.tokens.size();
    // Targets past `first_completion` are completion tokens or the eos.
    const int32_t first_completion = static_cast<int32_t>(prefix.size() + ex.prompt_ids.size()) + (bos >= 0 ? 1 : 0);
    b.tokens.insert(b.tokens.end(), prefix.begin(), prefix.end());
    if (bos >= 0) b.tokens.push_back(bos);
    b.tokens.insert(b.tokens.end(), ex.prompt_ids.begin(), ex.prompt_ids.end());
    b.tokens.insert(b.tokens.end(), ex.completion_ids.begin(), ex.completion_ids.end());
    b.tokens.push_back(eos);
    const int32_t len = static_cast<int32_t>(b.tokens.size() - start);
    for (int32_t j = 0; j < len; ++j) {
      b.positions.push_back(j);
      if (j + 1 < len) {
        // Inside the prefix the next id is a soft prompt's, not a token.
        b.targets.push_back(static_cast<size_t>(j + 1) < prefix.size() ? 0 : b.tokens[start + j + 1]);
        // Target j+1 is a completion token or the eos when j+1 >=
        // first_completion (the prefix, the bos when there is one, then
        // the prompt come first).
        b.loss_mask.push_back(j + 1 >= first_completion ? 1.0f : 0.0f);
      } else {
        b.targets.push_back(0);
        b.loss_mask.push_back(0.0f);
      }
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    ++b.num_sequences;
  }
  return b;
}

}  // namespace tandem::rl
