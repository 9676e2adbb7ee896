// Hugging Face chat templates rendered in C++.
//
// A chat template (tokenizer_config.json's "chat_template") is a jinja2
// program that turns a conversation into the model's prompt text.
// ChatTemplate renders it exactly as transformers' apply_chat_template(...,
// tokenize=False) does: a jinja2 ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, loop controls, raise_exception(),
// strftime_now() and transformers' tojson (json.dumps, ensure_ascii=False).
// The language subset and what is refused are described in parser.h and
// docs/chat-templates.md; anything outside it fails with an error naming
// the template line instead of rendering differently from Python.
//
// A ChatTemplate is immutable after Parse and may be rendered from several
// threads at once. Rendering is bounded by Limits (output size, loop
// iterations, nesting, work).
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/chat_template/limits.h"

namespace tandem::chat_template {

struct TemplateAst;

class ChatTemplate {
 public:
  // Errors: InvalidArgument (syntax), Unimplemented (outside the subset),
  // ResourceExhausted (nesting); messages start "chat template line N: ".
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source, const Limits& limits = Limits());

  // messages: a JSON array of {role, content, ...} objects; extra: a JSON
  // object of further template variables (bos_token, eos_token, tools,
  // documents, enable_thinking, ...), as apply_chat_template's keyword
  // arguments. `tools` and `documents` are None unless given. Key order of
  // JSON objects is kept (it shows in tojson and in iteration).
  // Errors: InvalidArgument for bad input and template runtime errors
  // (including raise_exception), Unimplemented, ResourceExhausted; template
  // errors start "chat template line N: ".
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // The local time strftime_now() formats; by default the system clock.
  void set_clock(std::function<std::tm()> now) { now_ = std::move(now); }

 private:
  ChatTemplate(std::shared_ptr<const TemplateAst> ast, const Limits& limits) : ast_(std::move(ast)), limits_(limits) {}

  std::shared_ptr<const TemplateAst> ast_;
  Limits limits_;
  std::function<std::tm()> now_;
};

// What a tokenizer directory says about chat formatting.
struct TokenizerChatTemplate {
  std::string source;  // the template text
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // The variables transformers passes to every render (its
  // special_tokens_map): bos_token, eos_token, unk_token, sep_token,
  // pad_token, cls_token, mask_token (those set) and
  // additional_special_tokens (a list), as strings.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// Reads DIR/tokenizer_config.json. The template comes from
// DIR/chat_template.jinja, else DIR/chat_template.json, else the config's
// "chat_template" (a string, or a list of {name, template} from which
// `name` is picked). Special tokens may be strings or {"content": ...}
// objects. Errors (InvalidArgument / NotFound) name the file.
absl::StatusOr<TokenizerChatTemplate> LoadTokenizerChatTemplate(const std::string& dir,
                                                                std::string_view name = "default");

}  // namespace tandem::chat_template
