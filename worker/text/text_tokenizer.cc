// text::Tokenizer implementations: see text_tokenizer.h.
#include "worker/text/text_tokenizer.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/chat_template.h"
#include "worker/model/file_util.h"
#include "worker/tokenizer/hf_tokenizer.h"
#include "worker/tokenizer/streaming_decoder.h"

namespace tandem::text {
namespace {

namespace fs = std::filesystem;

class CharStream final : public StreamDecoder {
 public:
  explicit CharStream(const model::CharTokenizer& tok) : tok_(tok) {}
  std::string Add(int32_t id) override { return tok_.Decode(std::span<const int32_t>(&id, 1)); }
  std::string Flush() override { return ""; }

 private:
  model::CharTokenizer tok_;
};

class CharText final : public Tokenizer {
 public:
  std::string_view kind() const override { return "char"; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    return tok_.EncodeOrError(text);
  }
  std::string Decode(std::span<const int32_t> ids, bool) const override { return tok_.Decode(ids); }
  std::unique_ptr<StreamDecoder> NewStreamDecoder(bool) const override { return std::make_unique<CharStream>(tok_); }
  std::optional<int32_t> bos() const override { return tok_.bos(); }
  std::optional<int32_t> eos() const override { return tok_.eos(); }
  std::optional<int32_t> pad() const override { return tok_.pad(); }
  int vocab_size() const override { return tok_.vocab_size(); }
  absl::Status SaveTo(const std::string& dir) const override { return tok_.Save(dir); }

 private:
  model::CharTokenizer tok_ = model::CharTokenizer::Default();
};

class HfStream final : public StreamDecoder {
 public:
  HfStream(const tokenizer::HfTokenizer& tok, bool skip) : dec_(tok, skip) {}
  std::string Add(int32_t id) override { return dec_.Add(id); }
  std::string Flush() override { return dec_.Flush(); }

 private:
  tokenizer::StreamingDecoder dec_;
};

class HfText final : public Tokenizer {
 public:
  HfText(tokenizer::HfTokenizer tok, std::string dir) : tok_(std::move(tok)), dir_(std::move(dir)) {}

  std::string_view kind() const override { return "hf"; }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override {
    return tok_.Encode(text, add_special_tokens);
  }
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return tok_.Decode(ids, skip_special_tokens);
  }
  std::unique_ptr<StreamDecoder> NewStreamDecoder(bool skip_special_tokens) const override {
    return std::make_unique<HfStream>(tok_, skip_special_tokens);
  }
  std::optional<int32_t> bos() const override { return tok_.bos_id(); }
  std::optional<int32_t> eos() const override { return tok_.eos_id(); }
  std::optional<int32_t> pad() const override { return tok_.pad_id(); }
  int vocab_size() const override { return tok_.vocab_size(); }

  bool has_chat_template() const override { return chat_.has_value(); }
  absl::StatusOr<std::string> ApplyChatTemplate(const nlohmann::ordered_json& messages,
                                                bool add_generation_prompt) const override {
    if (!chat_) return absl::FailedPreconditionError(chat_error_);
    return chat_->Render(messages, add_generation_prompt, special_tokens_);
  }
  absl::Status SaveTo(const std::string& dir) const override { return CopyTokenizerFiles(dir_, dir); }

  absl::Status LoadChatTemplate() {
    auto t = chat_template::LoadTokenizerChatTemplate(dir_);
    if (!t.ok()) {
      if (t.status().code() != absl::StatusCode::kNotFound) return t.status();
      chat_error_ = std::string(t.status().message());
      return absl::OkStatus();
    }
    auto parsed = chat_template::ChatTemplate::Parse(t->source);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(), absl::StrCat(dir_, ": chat template: ", parsed.status().message()));
    }
    chat_.emplace(std::move(*parsed));
    special_tokens_ = t->special_tokens;
    return absl::OkStatus();
  }

 private:
  tokenizer::HfTokenizer tok_;
  std::string dir_;
  std::optional<chat_template::ChatTemplate> chat_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::string chat_error_ = "the tokenizer has no chat template";
};

}  // namespace

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(const nlohmann::ordered_json&, bool) const {
  return absl::FailedPreconditionError(absl::StrCat("the ", std::string(kind()), " tokenizer has no chat template"));
}

std::shared_ptr<const Tokenizer> MakeCharTokenizer() { return std::make_shared<CharText>(); }

absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadHfTokenizer(const std::string& dir) {
  ASSIGN_OR_RETURN(auto tok, tokenizer::HfTokenizer::LoadDir(dir));
  auto out = std::make_shared<HfText>(std::move(tok), dir);
  RETURN_IF_ERROR(out->LoadChatTemplate());
  return std::shared_ptr<const Tokenizer>(std::move(out));
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadModelTokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(dir, ": no tokenizer.json"));
  ASSIGN_OR_RETURN(auto text, model::ReadFileToString(path));
  // The char tokenizer's file is a small object with "type": "char".
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("type") && j["type"] == "char") {
    auto c = model::CharTokenizer::FromJson(text);
    if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
    return MakeCharTokenizer();
  }
  return LoadHfTokenizer(dir);
}

absl::StatusOr<std::vector<int32_t>> GenerationConfigEosIds(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::vector<int32_t>{};
  ASSIGN_OR_RETURN(auto text, model::ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  std::vector<int32_t> out;
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return out;
  auto add = [&](const nlohmann::json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"eos_token_id\" must be a non-negative integer or a list of them"));
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const auto& v : *it) {
      RETURN_IF_ERROR(add(v));
    }
  } else if (absl::Status st = add(*it); !st.ok()) {
    return st;
  }
  return out;
}

absl::Status CopyTokenizerFiles(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to, ": ", ec.message()));
  if (fs::exists(from, ec) && fs::exists(to, ec) && fs::equivalent(from, to, ec)) {
    return absl::OkStatus();
  }
  for (const char* name : kTokenizerFiles) {
    const fs::path src = fs::path(from) / name;
    if (!fs::exists(src, ec)) continue;
    ASSIGN_OR_RETURN(auto data, model::ReadFileToString(src.string()));
    RETURN_IF_ERROR(model::WriteFileAtomic((fs::path(to) / name).string(), data));
  }
  return absl::OkStatus();
}

}  // namespace tandem::text
