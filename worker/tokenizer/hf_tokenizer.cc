#include "worker/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "worker/model/strict_json.h"  // kMaxJsonDepth
#include "worker/tokenizer/added_tokens.h"
#include "worker/tokenizer/bpe.h"
#include "worker/tokenizer/decoder.h"
#include "worker/tokenizer/json_fields.h"
#include "worker/tokenizer/normalizer.h"
#include "worker/tokenizer/post_processor.h"
#include "worker/tokenizer/pre_tokenizer.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// Parses JSON, refusing duplicate object keys (a vocabulary listing a token
// twice) and nesting deeper than model::kMaxJsonDepth (the loaders recurse
// into nested normalizers, pre-tokenizers and decoders), with errors that
// name the position.
absl::StatusOr<Json> ParseJson(std::string_view text) {
  struct Frame {
    bool is_object;
    std::string key;  // the key being read in this object
    absl::flat_hash_set<std::string> keys;
  };
  std::vector<Frame> stack;
  std::string duplicate;
  auto path = [&stack] {
    std::vector<std::string> parts;
    for (size_t i = 0; i + 1 < stack.size(); ++i) {
      parts.push_back(stack[i].is_object ? stack[i].key : "[]");
    }
    std::string out;
    for (const std::string& p : parts) {
      if (p == "[]") {
        out += "[]";
      } else {
        out += out.empty() ? p : "." + p;
      }
    }
    return out.empty() ? std::string("the top-level object") : out;
  };
  std::string too_deep;
  Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (!too_deep.empty()) return false;
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        if (depth >= model::kMaxJsonDepth) {
          too_deep = absl::StrCat("nested deeper than ", model::kMaxJsonDepth, " levels");
          return false;
        }
        stack.push_back({event == Json::parse_event_t::object_start, "", {}});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!stack.empty()) stack.pop_back();
        break;
      case Json::parse_event_t::key: {
        Frame& f = stack.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second && duplicate.empty()) {
          duplicate = absl::StrCat("duplicate key ", Quote(f.key), " in ", path());
        }
        break;
      }
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), cb);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!too_deep.empty()) return absl::InvalidArgumentError(too_deep);
  if (!duplicate.empty()) return absl::InvalidArgumentError(duplicate);
  return j;
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", p.string()));
  return ss.str();
}

const Json& FieldOrNull(const Json& j, std::string_view key) {
  static const Json kNull;
  const Json* v = FindField(j, key);
  return v == nullptr ? kNull : *v;
}

// A token named in tokenizer_config.json: "text" or {"content": "text", ...}.
absl::StatusOr<std::optional<std::string>> ConfigTokenText(const Json& v, const std::string& path) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object()) {
    const Json* content = FindField(v, "content");
    if (content != nullptr && content->is_string()) {
      return std::optional<std::string>(content->get<std::string>());
    }
  }
  return JsonTypeError(path, "a string, an object with \"content\", or null", v);
}

void ReplaceAllLiteral(std::string_view from, std::string_view to, std::string* s) {
  if (s->find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  for (size_t hit; (hit = s->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(*s, pos, hit - pos);
    out.append(to);
  }
  out.append(*s, pos);
  *s = std::move(out);
}

}  // namespace

std::string CleanUpTokenizationSpaces(std::string_view text) {
  std::string s(text);
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) ReplaceAllLiteral(from, to, &s);
  return s;
}

struct HfTokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  PostProcessor post_processor;
  Decoder decoder;

  std::vector<AddedToken> added;
  absl::flat_hash_map<std::string, int> added_by_content;
  AddedTokenMatcher raw_matcher;         // tokens matched before normalization
  AddedTokenMatcher normalized_matcher;  // tokens matched in normalized text

  std::vector<const std::string*> id_table;  // id -> token text; nullptr: unused id
  std::vector<bool> special;                 // by id
  std::vector<bool> byte_token;              // by id: "<0xNN>"

  std::optional<int32_t> bos, eos, pad, unk;
  bool clean_up = false;
  std::string chat_template;
  std::map<std::string, std::string> chat_templates;

  // tokenizer.json, then tokenizer_config.json (which may replace the
  // post-processor) and the added-token matchers.
  absl::Status Build(const Json& tj);
  absl::Status ReadAddedTokens(const Json& tj);
  absl::Status ReadConfig(const Json& cj);
  std::optional<int32_t> Lookup(std::string_view token) const {
    if (auto it = added_by_content.find(absl::string_view(token.data(), token.size())); it != added_by_content.end()) {
      return added[static_cast<size_t>(it->second)].id;
    }
    return model->TokenToId(token);
  }
  bool Known(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_table.size() && id_table[static_cast<size_t>(id)];
  }
};

absl::Status HfTokenizer::Impl::Build(const Json& tj) {
  RETURN_IF_ERROR(CheckFields(tj, "",
                              {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                               "model", "post_processor", "decoder"}));
  if (const Json* v = FindField(tj, "version"); v != nullptr && !v->is_string()) {
    return JsonTypeError("version", "a string", *v);
  }
  for (const char* key : {"truncation", "padding"}) {
    if (!FieldOrNull(tj, key).is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(key,
                                                     " is set: it is not supported (Encode never truncates or pads; "
                                                     "set it to null)"));
    }
  }
  const Json* model_json = FindField(tj, "model");
  if (model_json == nullptr) return absl::InvalidArgumentError("model is missing");
  ASSIGN_OR_RETURN(const std::string model_type, ReadType(*model_json, "model"));
  if (model_type != "BPE") return UnsupportedType("model", model_type, "BPE");
  ASSIGN_OR_RETURN(model, BpeModel::FromJson(*model_json, "model"));
  ASSIGN_OR_RETURN(normalizer, Normalizer::FromJson(FieldOrNull(tj, "normalizer"), "normalizer"));
  ASSIGN_OR_RETURN(pre_tokenizer, PreTokenizer::FromJson(FieldOrNull(tj, "pre_tokenizer"), "pre_tokenizer"));
  ASSIGN_OR_RETURN(decoder, Decoder::FromJson(FieldOrNull(tj, "decoder"), "decoder"));
  RETURN_IF_ERROR(ReadAddedTokens(tj));

  // id -> text, over the model's vocabulary and the added tokens.
  int64_t limit = model->id_limit();
  int64_t used = static_cast<int64_t>(model->size());
  for (const AddedToken& t : added) {
    limit = std::max<int64_t>(limit, t.id + 1);
    if (model->IdToToken(t.id) == nullptr) ++used;
  }
  if (limit - used > kMaxUnusedIds) {
    return absl::InvalidArgumentError(absl::StrCat("added_tokens: ids go up to ", limit - 1, " but there are only ",
                                                   used, " tokens (at most ", kMaxUnusedIds,
                                                   " unused ids are accepted)"));
  }
  id_table.assign(static_cast<size_t>(limit), nullptr);
  special.assign(static_cast<size_t>(limit), false);
  byte_token.assign(static_cast<size_t>(limit), false);
  for (int32_t id = 0; id < model->id_limit(); ++id) id_table[static_cast<size_t>(id)] = model->IdToToken(id);
  for (const AddedToken& t : added) {
    id_table[static_cast<size_t>(t.id)] = &t.content;
    special[static_cast<size_t>(t.id)] = t.special;
  }
  for (size_t id = 0; id < id_table.size(); ++id) {
    const std::string* t = id_table[id];
    byte_token[id] = t != nullptr && t->size() == 6 && t->compare(0, 3, "<0x") == 0 && (*t)[5] == '>' &&
                     std::isxdigit(static_cast<unsigned char>((*t)[3])) &&
                     std::isxdigit(static_cast<unsigned char>((*t)[4]));
  }

  auto known = [this](int32_t id) { return Known(id); };
  ASSIGN_OR_RETURN(post_processor, PostProcessor::FromJson(FieldOrNull(tj, "post_processor"), "post_processor", known));
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::ReadAddedTokens(const Json& tj) {
  const Json& list = FieldOrNull(tj, "added_tokens");
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return JsonTypeError("added_tokens", "an array", list);
  added.reserve(list.size());
  absl::flat_hash_map<int32_t, size_t> by_id;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = JsonPath("added_tokens", i);
    const Json& e = list[i];
    RETURN_IF_ERROR(
        CheckFields(e, path, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}));
    AddedToken t;
    const Json* id = FindField(e, "id");
    if (id == nullptr) return absl::InvalidArgumentError(JsonPath(path, "id") + " is missing");
    ASSIGN_OR_RETURN(const int64_t id64, ReadIntValue(*id, JsonPath(path, "id"), 0, kMaxTokenId));
    t.id = static_cast<int32_t>(id64);
    ASSIGN_OR_RETURN(t.content, ReadString(e, path, "content"));
    if (t.content.empty()) return absl::InvalidArgumentError(JsonPath(path, "content") + " is empty");
    ASSIGN_OR_RETURN(const bool single_word, ReadBool(e, path, "single_word", false));
    if (single_word) {
      return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "single_word"), " true is not supported"));
    }
    ASSIGN_OR_RETURN(t.lstrip, ReadBool(e, path, "lstrip", false));
    ASSIGN_OR_RETURN(t.rstrip, ReadBool(e, path, "rstrip", false));
    ASSIGN_OR_RETURN(t.special, ReadBool(e, path, "special", false));
    ASSIGN_OR_RETURN(t.normalized, ReadBool(e, path, "normalized", !t.special));
    if (auto prev = by_id.find(t.id); prev != by_id.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": id ", t.id, " is already ", Quote(added[prev->second].content)));
    }
    if (added_by_content.contains(t.content)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", Quote(t.content), " is listed twice"));
    }
    if (auto model_id = model->TokenToId(t.content); model_id && *model_id != t.id) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", Quote(t.content), " has id ", *model_id, " in model.vocab, not ", t.id));
    }
    if (const std::string* model_text = model->IdToToken(t.id); model_text != nullptr && *model_text != t.content) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": id ", t.id, " is ", Quote(*model_text), " in model.vocab, not ", Quote(t.content)));
    }
    by_id.emplace(t.id, added.size());
    added_by_content.emplace(t.content, static_cast<int>(added.size()));
    added.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::Impl::ReadConfig(const Json& cj) {
  if (!cj.is_object()) return JsonTypeError("(top level)", "an object", cj);
  auto resolve = [this, &cj](const char* key, std::optional<int32_t>* out) -> absl::Status {
    ASSIGN_OR_RETURN(const std::optional<std::string> text, ConfigTokenText(FieldOrNull(cj, key), key));
    if (!text) return absl::OkStatus();
    *out = Lookup(*text);
    if (!*out) {
      return absl::InvalidArgumentError(absl::StrCat(key, " ", Quote(*text), " is not a token of tokenizer.json"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(resolve("bos_token", &bos));
  RETURN_IF_ERROR(resolve("eos_token", &eos));
  RETURN_IF_ERROR(resolve("pad_token", &pad));
  RETURN_IF_ERROR(resolve("unk_token", &unk));

  const Json& extra = FieldOrNull(cj, "additional_special_tokens");
  if (!extra.is_null()) {
    if (!extra.is_array()) return JsonTypeError("additional_special_tokens", "an array", extra);
    for (size_t i = 0; i < extra.size(); ++i) {
      const std::string path = JsonPath("additional_special_tokens", i);
      ASSIGN_OR_RETURN(const std::optional<std::string> text, ConfigTokenText(extra[i], path));
      if (!text) continue;
      const std::optional<int32_t> id = Lookup(*text);
      if (!id) {
        return absl::InvalidArgumentError(absl::StrCat(path, " ", Quote(*text), " is not a token of tokenizer.json"));
      }
      special[static_cast<size_t>(*id)] = true;
    }
  }

  // transformers adds tokens listed here that tokenizer.json lacks; this
  // tokenizer would not know them, so they must agree.
  const Json& decoder_map = FieldOrNull(cj, "added_tokens_decoder");
  if (!decoder_map.is_null()) {
    if (!decoder_map.is_object()) {
      return JsonTypeError("added_tokens_decoder", "an object", decoder_map);
    }
    for (auto it = decoder_map.begin(); it != decoder_map.end(); ++it) {
      const std::string path = JsonPath("added_tokens_decoder", it.key());
      int64_t id = -1;
      if (!it.key().empty() && it.key().size() <= 9 &&
          std::all_of(it.key().begin(), it.key().end(), [](char c) { return c >= '0' && c <= '9'; })) {
        id = std::stoll(it.key());
      }
      if (id < 0) return absl::InvalidArgumentError(path + ": the key is not a token id");
      ASSIGN_OR_RETURN(const std::optional<std::string> text, ConfigTokenText(it.value(), path));
      if (!text) continue;
      if (!Known(static_cast<int32_t>(id)) || *id_table[static_cast<size_t>(id)] != *text) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": ", Quote(*text), " does not match tokenizer.json (id ", id, " is ",
                         Known(static_cast<int32_t>(id)) ? Quote(*id_table[static_cast<size_t>(id)]) : "unused", ")"));
      }
    }
  }

  ASSIGN_OR_RETURN(clean_up, ReadBool(cj, "", "clean_up_tokenization_spaces", false));
  ASSIGN_OR_RETURN(const bool split_special, ReadBool(cj, "", "split_special_tokens", false));

  // add_bos_token / add_eos_token replace the post-processor.
  const Json* add_bos = FindField(cj, "add_bos_token");
  const Json* add_eos = FindField(cj, "add_eos_token");
  if ((add_bos && !add_bos->is_null()) || (add_eos && !add_eos->is_null())) {
    ASSIGN_OR_RETURN(const bool want_bos, ReadBool(cj, "", "add_bos_token", false));
    ASSIGN_OR_RETURN(const bool want_eos, ReadBool(cj, "", "add_eos_token", false));
    if (want_bos && !bos) return absl::InvalidArgumentError("add_bos_token is true but bos_token is not set");
    if (want_eos && !eos) return absl::InvalidArgumentError("add_eos_token is true but eos_token is not set");
    post_processor = PostProcessor::BosEos(want_bos ? bos : std::nullopt, want_eos ? eos : std::nullopt);
  }

  const Json& tmpl = FieldOrNull(cj, "chat_template");
  if (tmpl.is_string()) {
    chat_template = tmpl.get<std::string>();
    chat_templates["default"] = chat_template;
  } else if (tmpl.is_array()) {
    for (size_t i = 0; i < tmpl.size(); ++i) {
      const std::string path = JsonPath("chat_template", i);
      RETURN_IF_ERROR(CheckFields(tmpl[i], path, {"name", "template"}));
      ASSIGN_OR_RETURN(const std::string name, ReadString(tmpl[i], path, "name"));
      ASSIGN_OR_RETURN(chat_templates[name], ReadString(tmpl[i], path, "template"));
    }
    if (auto it = chat_templates.find("default"); it != chat_templates.end()) {
      chat_template = it->second;
    }
  } else if (!tmpl.is_null()) {
    return JsonTypeError("chat_template", "a string or a list of {name, template}", tmpl);
  }

  // The added-token matchers (normalized tokens are matched in normalized text).
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (split_special && t.special) continue;
    if (!t.normalized) {
      raw_matcher.Add(t.content, static_cast<int>(i));
    } else {
      std::string buf;
      normalized_matcher.Add(normalizer.Normalize(t.content, &buf), static_cast<int>(i));
    }
  }
  return absl::OkStatus();
}

HfTokenizer::HfTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;
HfTokenizer::~HfTokenizer() = default;

absl::StatusOr<HfTokenizer> HfTokenizer::FromJson(std::string_view tokenizer_json, std::string_view config_json) {
  auto tj = ParseJson(tokenizer_json);
  if (!tj.ok()) return Annotate(tj.status(), "tokenizer.json: ");
  Json cj = Json::object();
  if (!config_json.empty()) {
    auto parsed = ParseJson(config_json);
    if (!parsed.ok()) return Annotate(parsed.status(), "tokenizer_config.json: ");
    cj = std::move(*parsed);
  }
  auto impl = std::make_unique<Impl>();
  RETURN_IF_ERROR(Annotate(impl->Build(*tj), "tokenizer.json: "));
  RETURN_IF_ERROR(Annotate(impl->ReadConfig(cj), "tokenizer_config.json: "));
  return HfTokenizer(std::move(impl));
}

absl::StatusOr<HfTokenizer> HfTokenizer::LoadDir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    return absl::NotFoundError(absl::StrCat("tokenizer directory ", dir, " does not exist"));
  }
  ASSIGN_OR_RETURN(const std::string tokenizer_json, ReadFile(root / "tokenizer.json"));
  std::string config_json;
  if (fs::exists(root / "tokenizer_config.json", ec)) {
    ASSIGN_OR_RETURN(config_json, ReadFile(root / "tokenizer_config.json"));
  }
  auto tok = FromJson(tokenizer_json, config_json);
  if (!tok.ok()) return Annotate(tok.status(), absl::StrCat(dir, ": "));
  if (fs::exists(root / "chat_template.jinja", ec)) {
    ASSIGN_OR_RETURN(std::string tmpl, ReadFile(root / "chat_template.jinja"));
    tok->impl_->chat_template = tmpl;
    tok->impl_->chat_templates["default"] = std::move(tmpl);
  }
  return tok;
}

std::vector<int32_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!IsValidUtf8(text)) {
    AppendUtf8Lossy(text, &repaired);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  thread_local PreTokenizer::Scratch pre_scratch;
  thread_local std::string normalized_buffer;
  auto emit_word = [&](std::string_view word) { m.model->Encode(word, &ids); };
  auto emit_token = [&](int index, size_t, size_t) { ids.push_back(m.added[static_cast<size_t>(index)].id); };
  auto encode_section = [&](size_t start, size_t end) {
    const std::string_view section = text.substr(start, end - start);
    const std::string_view norm = m.normalizer.empty() ? section : m.normalizer.Normalize(section, &normalized_buffer);
    if (norm.empty()) return;
    m.normalized_matcher.Split(
        norm, m.added,
        [&](size_t s, size_t e) {
          m.pre_tokenizer.Run(norm.substr(s, e - s), start == 0 && s == 0, &pre_scratch, emit_word);
        },
        emit_token);
  };
  m.raw_matcher.Split(text, m.added, encode_section, emit_token);
  m.post_processor.Apply(add_special_tokens, &ids);
  return ids;
}

std::string HfTokenizer::DecodeRaw(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (!m.Known(id)) continue;
    if (skip_special_tokens && m.special[static_cast<size_t>(id)]) continue;
    tokens.push_back(*m.id_table[static_cast<size_t>(id)]);
  }
  return m.decoder.Decode(std::move(tokens));
}

std::string HfTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string text = DecodeRaw(ids, skip_special_tokens);
  if (impl_->clean_up) return CleanUpTokenizationSpaces(text);
  return text;
}

std::optional<int32_t> HfTokenizer::TokenToId(std::string_view token) const { return impl_->Lookup(token); }

std::optional<std::string> HfTokenizer::IdToToken(int32_t id) const {
  if (!impl_->Known(id)) return std::nullopt;
  return *impl_->id_table[static_cast<size_t>(id)];
}

bool HfTokenizer::IsKnownId(int32_t id) const { return impl_->Known(id); }

bool HfTokenizer::IsSpecial(int32_t id) const { return impl_->Known(id) && impl_->special[static_cast<size_t>(id)]; }

int32_t HfTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_table.size()); }
std::optional<int32_t> HfTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> HfTokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> HfTokenizer::pad_id() const { return impl_->pad; }
std::optional<int32_t> HfTokenizer::unk_id() const { return impl_->unk; }
const std::string& HfTokenizer::chat_template() const { return impl_->chat_template; }
const std::map<std::string, std::string>& HfTokenizer::chat_templates() const { return impl_->chat_templates; }
bool HfTokenizer::clean_up_spaces() const { return impl_->clean_up; }
bool HfTokenizer::decoder_has_byte_fallback() const { return impl_->decoder.has_byte_fallback(); }
bool HfTokenizer::IsByteFallbackToken(int32_t id) const {
  return impl_->Known(id) && impl_->byte_token[static_cast<size_t>(id)];
}

}  // namespace tandem::tokenizer
