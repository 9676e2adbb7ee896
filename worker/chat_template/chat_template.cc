#include "worker/chat_template/chat_template.h"

#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "worker/chat_template/absl_view.h"
#include "worker/chat_template/ast.h"
#include "worker/chat_template/evaluator.h"
#include "worker/chat_template/parser.h"

namespace tandem::chat_template {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<Value> JsonValue(const Json& j, std::string_view what) {
  absl::StatusOr<Value> v = Value::FromJson(j);
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(AV(what), ": ", v.status().message()));
  return v;
}

bool FileExists(const std::string& path) {
  std::ifstream in(path);
  return in.good();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read: ", std::generic_category().message(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return ss.str();
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
}

// A special token: a string or an AddedToken-style {"content": ...}.
std::optional<std::string> TokenText(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

absl::StatusOr<std::string> PickTemplate(const Json& t, std::string_view name, const std::string& where) {
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": chat_template must be a string or a list of {name, template}"));
  }
  std::vector<std::string> names;
  for (const Json& e : t) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": chat_template list entries must be {name, template}"));
    }
    if (e["name"].get<std::string>() == name) return e["template"].get<std::string>();
    names.push_back(e["name"].get<std::string>());
  }
  return absl::NotFoundError(
      absl::StrCat(where, ": no chat template named '", AV(name), "' (it has: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, const Limits& limits) {
  ASSIGN_OR_RETURN(TemplateAst ast, ParseTemplate(source, limits));
  RETURN_IF_ERROR(FoldConstants(&ast, limits));
  return ChatTemplate(std::make_shared<const TemplateAst>(std::move(ast)), limits);
}

absl::StatusOr<std::string> ChatTemplate::Render(const Json& messages, bool add_generation_prompt,
                                                 const Json& extra) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a JSON array");
  if (!extra.is_object()) return absl::InvalidArgumentError("template variables must be a JSON object");
  DictData vars;
  ASSIGN_OR_RETURN(Value msgs, JsonValue(messages, "messages"));
  vars.Set("messages", msgs);
  vars.Set("tools", Value::None());
  vars.Set("documents", Value::None());
  vars.Set("add_generation_prompt", Value::Bool(add_generation_prompt));
  for (const auto& [key, value] : extra.items()) {
    if (key == "messages" || key == "add_generation_prompt") {
      return absl::InvalidArgumentError(absl::StrCat("template variable '", key, "' is set by the renderer"));
    }
    ASSIGN_OR_RETURN(Value v, JsonValue(value, key));
    vars.Set(key, std::move(v));
  }
  Interpreter interp(limits_, now_);
  std::string out;
  RETURN_IF_ERROR(interp.Render(*ast_, vars, &out));
  return out;
}

absl::StatusOr<TokenizerChatTemplate> LoadTokenizerChatTemplate(const std::string& dir, std::string_view name) {
  const std::string config_path = dir + "/tokenizer_config.json";
  ASSIGN_OR_RETURN(Json config, ReadJson(config_path));
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  TokenizerChatTemplate out;
  const std::string jinja_path = dir + "/chat_template.jinja";
  const std::string json_path = dir + "/chat_template.json";
  if (FileExists(jinja_path)) {
    ASSIGN_OR_RETURN(out.source, ReadFile(jinja_path));
  } else if (FileExists(json_path)) {
    ASSIGN_OR_RETURN(Json j, ReadJson(json_path));
    if (!j.is_object() || !j.contains("chat_template")) {
      return absl::InvalidArgumentError(absl::StrCat(json_path, ": has no \"chat_template\""));
    }
    ASSIGN_OR_RETURN(out.source, PickTemplate(j["chat_template"], name, json_path));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    ASSIGN_OR_RETURN(out.source, PickTemplate(config["chat_template"], name, config_path));
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": no chat template (no chat_template.jinja, no chat_template.json, ",
                                            "and tokenizer_config.json has no \"chat_template\")"));
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    std::optional<std::string> text = TokenText(config[key]);
    if (!text || text->empty()) continue;
    out.special_tokens[key] = *text;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    Json list = Json::array();
    for (const Json& t : config["additional_special_tokens"]) {
      if (std::optional<std::string> text = TokenText(t)) list.push_back(*text);
    }
    if (!list.empty()) out.special_tokens["additional_special_tokens"] = std::move(list);
  }
  if (out.special_tokens.contains("bos_token")) out.bos_token = out.special_tokens["bos_token"].get<std::string>();
  if (out.special_tokens.contains("eos_token")) out.eos_token = out.special_tokens["eos_token"].get<std::string>();
  return out;
}

}  // namespace tandem::chat_template
