#include "worker/model/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_util.h"
#include "worker/model/strict_json.h"

namespace tandem::model {

namespace {
constexpr int32_t kFirstChar = 3;
constexpr int32_t kNewline = 98;

int32_t CharId(unsigned char ch) {
  if (ch >= 32 && ch <= 126) return kFirstChar + (ch - 32);
  if (ch == '\n') return kNewline;
  return -1;
}
}  // namespace

std::vector<int32_t> CharTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char ch : text) {
    const int32_t id = CharId(ch);
    ids.push_back(id >= 0 ? id : CharId('?'));
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> CharTokenizer::EncodeOrError(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = text[i];
    const int32_t id = CharId(ch);
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("character 0x", absl::Hex(ch), " at byte ", i,
                                                     " is not in the char tokenizer's vocabulary (printable ASCII and "
                                                     "newline)"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::string CharTokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= kFirstChar && id < kNewline) {
      out.push_back(static_cast<char>(32 + id - kFirstChar));
    } else if (id == kNewline) {
      out.push_back('\n');
    }
  }
  return out;
}

std::string CharTokenizer::ToJson() const {
  nlohmann::json j;
  j["type"] = "char";
  j["version"] = 1;
  j["vocab_size"] = vocab_size();
  j["pad_token_id"] = pad();
  j["bos_token_id"] = bos();
  j["eos_token_id"] = eos();
  nlohmann::json vocab = nlohmann::json::array();
  vocab.push_back("<pad>");
  vocab.push_back("<bos>");
  vocab.push_back("<eos>");
  for (int c = 32; c <= 126; ++c) vocab.push_back(std::string(1, char(c)));
  vocab.push_back("\n");
  j["vocab"] = vocab;
  return j.dump(1) + "\n";
}

absl::Status CharTokenizer::Save(const std::string& dir) const {
  return WriteFileAtomic((std::filesystem::path(dir) / "tokenizer.json").string(), ToJson());
}

absl::StatusOr<CharTokenizer> CharTokenizer::FromJson(std::string_view text) {
  auto parsed = ParseStrictJson(text, "tokenizer.json");
  nlohmann::json j = parsed.ok() ? *std::move(parsed) : nlohmann::json();
  if (!j.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  }
  if (!j.contains("type") || j["type"] != "char") {
    return absl::InvalidArgumentError("tokenizer.json: only {\"type\": \"char\"} tokenizers are supported");
  }
  CharTokenizer t;
  if (j.contains("vocab")) {
    nlohmann::json expected = nlohmann::json::parse(t.ToJson())["vocab"];
    if (j["vocab"] != expected) {
      return absl::InvalidArgumentError("tokenizer.json: char vocabulary differs from the built-in one");
    }
  }
  return t;
}

absl::StatusOr<CharTokenizer> CharTokenizer::Load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  auto t = FromJson(text);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  }
  return t;
}

}  // namespace tandem::model
