// Every snippet of snippets.json (a template and its variables) renders
// byte for byte as jinja2 renders it (hf_render.py --snippets), or fails
// where jinja2 fails. The snippets exercise the interpreter's corners:
// whitespace control, scoping, undefined values, filters, tests, methods,
// printing of Python values, errors.
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

absl::StatusOr<std::string> RenderSnippet(const Json& snippet) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(snippet["template"].get<std::string>());
  if (!t.ok()) return t.status();
  Json vars = snippet.value("variables", Json::object());
  Json messages = vars.contains("messages") ? vars["messages"] : Json::array();
  bool agp = vars.contains("add_generation_prompt") && vars["add_generation_prompt"].get<bool>();
  vars.erase("messages");
  vars.erase("add_generation_prompt");
  return t->Render(messages, agp, vars);
}

TEST(ChatTemplateParity, SnippetsRenderAsJinja2Does) {
  const std::string path = SourceDir() + "/tests/chat_template/snippets.json";
  const Json snippets = ReadJsonFile(path);
  const Json expected = ReferenceResults("--snippets " + ShellQuote(path));
  ASSERT_EQ(expected.size(), snippets.size()) << "hf_render.py gave no result for some snippets";
  int compared = 0;
  for (size_t i = 0; i < snippets.size(); ++i) {
    const Json& s = snippets[i];
    const Json& want = expected[i];
    const std::string name = s["name"].get<std::string>();
    SCOPED_TRACE(name);
    absl::StatusOr<std::string> got = RenderSnippet(s);
    if (want.contains("text")) {
      ASSERT_TRUE(got.ok()) << name << ": jinja2 renders it, we fail: " << got.status();
      EXPECT_EQ(*got, want["text"].get<std::string>()) << name << "\ntemplate: " << s["template"];
    } else {
      EXPECT_FALSE(got.ok()) << name << ": jinja2 fails (" << want["error"].get<std::string>()
                             << "), we render: " << *got;
    }
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

}  // namespace
}  // namespace tandem::chat_template
