// Text data: see text_data.h.
#include "worker/rl/text_data.h"

#include <fstream>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/strict_json.h"
#include "worker/rl/sft_data.h"

namespace tandem::rl {
namespace {

using Json = nlohmann::ordered_json;

absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }

absl::StatusOr<std::string> StringField(const Json& row, const std::string& key, const char* what) {
  auto it = row.find(key);
  if (it == row.end() || it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("missing key \"", key, "\" (", what, ")"));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string, got ", it->type_name()));
  }
  return it->get<std::string>();
}

// Checks chat messages: an array of objects with string role and content.
absl::StatusOr<Json> Messages(const Json& row, const std::string& key) {
  auto it = row.find(key);
  if (it == row.end() || it->is_null()) {
    return absl::InvalidArgumentError(absl::StrCat("missing key \"", key, "\" (chat messages)"));
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", key, "\" must be an array of messages, got ", it->type_name()));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\"[", i, "] must be an object"));
    }
    for (const char* k : {"role", "content"}) {
      if (!m.contains(k) || !m[k].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("\"", key, "\"[", i, "].", k, " must be a string"));
      }
    }
  }
  return *it;
}

absl::StatusOr<TextRow> ParseRow(std::string_view line, const TextDataOptions& o, const text::Tokenizer& tok) {
  // Strict: no duplicate keys, bounded nesting (a row is untrusted input).
  ASSIGN_OR_RETURN(Json j, model::ParseStrictOrderedJson(line, "row"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected a JSON object, got ", j.type_name()));
  }
  TextRow row;
  std::string response;
  bool has_response = false;
  bool chat_rendered = false;
  if (!o.messages_key.empty()) {
    ASSIGN_OR_RETURN(Json prompt, Messages(j, o.messages_key));
    if (!prompt.empty() && prompt.back()["role"] == "assistant") {
      // The final assistant turn is the response, never part of the prompt.
      if (o.response_key.empty()) {
        response = prompt.back()["content"].get<std::string>();
        has_response = true;
      }
      prompt.erase(prompt.size() - 1);
    }
    if (prompt.empty()) return absl::InvalidArgumentError(absl::StrCat("\"", o.messages_key, "\" has no prompt turn"));
    if (!o.system_prompt.empty() && prompt.front()["role"] != "system") {
      prompt.insert(prompt.begin(), Json{{"role", "system"}, {"content", o.system_prompt}});
    }
    ASSIGN_OR_RETURN(row.prompt, tok.ApplyChatTemplate(prompt, /*add_generation_prompt=*/true));
    chat_rendered = true;
  } else {
    ASSIGN_OR_RETURN(auto text, StringField(j, o.prompt_key, "prompt"));
    if (o.chat) {
      Json prompt = Json::array();
      if (!o.system_prompt.empty()) prompt.push_back(Json{{"role", "system"}, {"content", o.system_prompt}});
      prompt.push_back(Json{{"role", "user"}, {"content", text}});
      ASSIGN_OR_RETURN(row.prompt, tok.ApplyChatTemplate(prompt, /*add_generation_prompt=*/true));
      chat_rendered = true;
    } else {
      row.prompt = o.system_prompt.empty() ? text : o.system_prompt + "\n\n" + text;
    }
  }
  if (o.need_answer) {
    ASSIGN_OR_RETURN(row.answer, StringField(j, o.answer_key, "reference answer"));
  } else if (!o.answer_key.empty() && j.contains(o.answer_key) && j[o.answer_key].is_string()) {
    row.answer = j[o.answer_key].get<std::string>();
  }
  if (!o.response_key.empty() && (o.need_response || j.contains(o.response_key))) {
    ASSIGN_OR_RETURN(response, StringField(j, o.response_key, "response"));
    has_response = true;
  }
  if (o.need_response && !has_response) {
    return absl::InvalidArgumentError(o.messages_key.empty() ? absl::StrCat("no response: set data.response_key")
                                                             : absl::StrCat("no response: \"", o.messages_key,
                                                                            "\" does not end with an assistant turn"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == o.prompt_key || k == o.messages_key || k == o.answer_key || k == o.response_key) continue;
    row.fields[k] = it->is_string() ? it->get<std::string>() : it->dump();
  }
  auto ids = tok.Encode(row.prompt, /*add_special_tokens=*/!chat_rendered);
  if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
  if (ids->empty()) return absl::InvalidArgumentError("the prompt is empty");
  row.prompt_ids = std::move(*ids);
  if (has_response) {
    auto r = tok.Encode(response, /*add_special_tokens=*/false);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("response: ", r.status().message()));
    if (r->empty()) return absl::InvalidArgumentError("the response is empty");
    row.response = std::move(response);
    row.response_ids = std::move(*r);
  }
  return row;
}

}  // namespace

absl::StatusOr<TextDataset> TextDataset::FromText(std::string_view text, std::string_view name,
                                                  const TextDataOptions& o, const text::Tokenizer& tok) {
  TextDataset d;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    ++line_no;
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    absl::StatusOr<TextRow> row =
        line.size() > kMaxLineBytes
            ? absl::InvalidArgumentError(absl::StrCat("line is longer than ", kMaxLineBytes, " bytes"))
            : ParseRow(line, o, tok);
    if (row.ok() && o.max_sequence_tokens > 0) {
      const int64_t len = static_cast<int64_t>(row->prompt_ids.size() + row->response_ids.size()) + 1;
      if (len > o.max_sequence_tokens) {
        row = absl::InvalidArgumentError(
            absl::StrCat("sequence of ", len, " tokens (with eos) exceeds train.seq_len ", o.max_sequence_tokens));
      }
    }
    if (!row.ok()) {
      std::string msg = absl::StrCat(Sv(name), ":", line_no, ": ", row.status().message());
      if (!o.skip_bad_rows) return absl::InvalidArgumentError(msg);
      if (d.stats_.bad_rows_skipped++ == 0) d.stats_.first_bad_row = std::move(msg);
      continue;
    }
    row->line = line_no;
    if (o.max_prompt_tokens > 0 && static_cast<int64_t>(row->prompt_ids.size()) > o.max_prompt_tokens) {
      if (!o.truncate_overflow) {
        d.stats_.prompts_dropped++;
        continue;
      }
      row->prompt_ids.erase(row->prompt_ids.begin(), row->prompt_ids.end() - o.max_prompt_tokens);
      d.stats_.prompts_truncated++;
    }
    d.rows_.push_back(std::move(*row));
  }
  d.stats_.rows = static_cast<int64_t>(d.rows_.size());
  if (d.rows_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(name), ": no usable rows (", d.stats_.bad_rows_skipped,
                                                   " bad rows skipped, ", d.stats_.prompts_dropped,
                                                   " prompts over data.max_prompt_tokens dropped)"));
  }
  return d;
}

absl::StatusOr<TextDataset> TextDataset::Load(const std::string& path, const TextDataOptions& o,
                                              const text::Tokenizer& tok) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(o.field, ": cannot open ", path));
  // Reads line by line into a bounded buffer: an over-long line is
  // replaced by a marker line that fails as too long, never held whole.
  std::string text;
  std::vector<char> buf(kMaxLineBytes + 2);
  const std::string too_long(kMaxLineBytes + 1, ' ');
  while (true) {
    in.getline(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize got = in.gcount();
    if (got == 0 && in.eof()) break;
    if (in.fail() && !in.eof()) {
      // Skip the rest of the line.
      in.clear();
      in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
      text.append("\"");  // non-blank, and too long below
      text.append(too_long);
      text.push_back('\n');
      if (in.eof()) break;
      continue;
    }
    size_t len = static_cast<size_t>(got);
    if (!in.eof() && len > 0) --len;
    text.append(buf.data(), len);
    text.push_back('\n');
    if (in.eof()) break;
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return FromText(text, path, o, tok);
}

uint64_t DataOrder(uint64_t seed, uint64_t n, bool shuffle, uint64_t flat) {
  const DataCursor c = CursorAt(flat, n);
  if (!shuffle) return static_cast<uint64_t>(c.position);
  return EpochPermute(seed, static_cast<uint64_t>(c.epoch), n, static_cast<uint64_t>(c.position));
}

DataCursor CursorAt(uint64_t flat, uint64_t n) {
  if (n == 0) return {};
  return {static_cast<int64_t>(flat / n), static_cast<int64_t>(flat % n)};
}

}  // namespace tandem::rl
