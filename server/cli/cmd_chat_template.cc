// tandemctl chat-template: renders a conversation with a tokenizer's chat
// template (worker/chat_template), exactly as transformers'
// apply_chat_template(..., tokenize=False) would, and prints the prompt.
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/cli/cli_args.h"
#include "server/cli/commands.h"
#include "server/cli/exit_codes.h"
#include "worker/chat_template/chat_template.h"

namespace tandem::cli {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kUsage[] =
    "Usage: tandemctl chat-template --tokenizer DIR --messages-file F.json [--add-generation-prompt]\n"
    "Renders a conversation with the chat template of a Hugging Face tokenizer directory\n"
    "(tokenizer_config.json, or chat_template.jinja / chat_template.json next to it) and\n"
    "prints the prompt exactly, without a trailing newline.\n"
    "  --tokenizer DIR            directory holding tokenizer_config.json\n"
    "  --messages-file F          JSON: a list of {role, content, ...} messages, or an object\n"
    "                             {\"messages\": [...], ...} whose other keys are template\n"
    "                             variables (tools, documents, enable_thinking, ...)\n"
    "  --add-generation-prompt    end with the assistant turn's opening\n"
    "  --help                     this help\n"
    "The tokenizer's special tokens (bos_token, eos_token, ...) are template variables too.\n"
    "Exit codes: 0 ok, 1 the template failed (syntax outside the supported subset,\n"
    "            raise_exception, runtime error), 2 usage or unreadable input.\n";

int UsageError(const std::string& message) {
  std::cerr << "tandemctl chat-template: " << message << "\n\n" << kUsage;
  return kExitUsage;
}

int InputError(const std::string& message) {
  std::cerr << "tandemctl chat-template: " << message << "\n";
  return kExitUsage;
}

}  // namespace

int CmdChatTemplate(const Args& args) {
  FlagSpec spec;
  spec.with_value = {"tokenizer", "messages-file"};
  spec.booleans = {"add-generation-prompt"};
  absl::StatusOr<ParsedArgs> p = ParseArgs(args, spec);
  if (!p.ok()) return UsageError(std::string(p.status().message()));
  if (p->Has("help")) {
    std::cout << kUsage;
    return kExitOk;
  }
  if (!p->positional.empty()) return UsageError(absl::StrCat("unexpected argument '", p->positional[0], "'"));
  const std::string dir = p->Get("tokenizer");
  const std::string messages_path = p->Get("messages-file");
  if (dir.empty() || messages_path.empty()) return UsageError("--tokenizer and --messages-file are required");

  std::ifstream in(messages_path, std::ios::binary);
  if (!in) return InputError(absl::StrCat(messages_path, ": cannot read"));
  std::stringstream text;
  text << in.rdbuf();
  Json data;
  try {
    data = Json::parse(text.str());
  } catch (const Json::parse_error& e) {
    return InputError(absl::StrCat(messages_path, ": invalid JSON: ", e.what()));
  }
  Json messages;
  Json variables = Json::object();
  if (data.is_array()) {
    messages = std::move(data);
  } else if (data.is_object() && data.contains("messages") && data["messages"].is_array()) {
    messages = data["messages"];
    for (const auto& [key, value] : data.items()) {
      if (key != "messages") variables[key] = value;
    }
  } else {
    return InputError(absl::StrCat(messages_path, ": expected a list of messages or {\"messages\": [...], ...}"));
  }

  absl::StatusOr<chat_template::TokenizerChatTemplate> loaded = chat_template::LoadTokenizerChatTemplate(dir);
  if (!loaded.ok()) return InputError(std::string(loaded.status().message()));
  Json extra = loaded->special_tokens;
  for (const auto& [key, value] : variables.items()) extra[key] = value;

  absl::StatusOr<chat_template::ChatTemplate> tmpl = chat_template::ChatTemplate::Parse(loaded->source);
  if (!tmpl.ok()) {
    std::cerr << "tandemctl chat-template: " << dir << ": " << tmpl.status().message() << "\n";
    return kExitFailed;
  }
  absl::StatusOr<std::string> prompt = tmpl->Render(messages, p->Has("add-generation-prompt"), extra);
  if (!prompt.ok()) {
    std::cerr << "tandemctl chat-template: " << prompt.status().message() << "\n";
    return kExitFailed;
  }
  std::cout.write(prompt->data(), static_cast<std::streamsize>(prompt->size()));
  std::cout.flush();
  return std::cout ? kExitOk : kExitFailed;
}

}  // namespace tandem::cli
