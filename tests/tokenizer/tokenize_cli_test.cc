// `tandemctl tokenize`, through the real tandemctl binary: ids as the
// library encodes them, exact decoding, the output formats, and clear
// errors with exit code 2 (bad input) or 1 (the tokenizer cannot load).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/hf_tokenizer.h"

namespace tandem::tokenizer {
namespace {

namespace fs = std::filesystem;
using testing::ShellQuote;

struct Result {
  int rc = -1;
  std::string out, err;
};

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ModelDir(testing::kRealTokenizers[0]);
    ASSERT_FALSE(dir_.empty());
    tmp_ = fs::path(::testing::TempDir()) / ("tok_cli_" + std::to_string(::getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // Runs tandemctl with `args` (already quoted), stdin from `stdin_file`.
  Result Run(const std::string& args, const std::string& stdin_file = "/dev/null") {
    const std::string err_path = (tmp_ / "stderr").string();
    const std::string cmd =
        ShellQuote(TANDEMCTL) + " " + args + " <" + ShellQuote(stdin_file) + " 2>" + ShellQuote(err_path);
    Result r;
    FILE* f = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) r.out.append(buf, n);
    const int status = ::pclose(f);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = testing::ReadText(err_path);
    return r;
  }
  std::string File(const std::string& name, const std::string& content) {
    const std::string p = (tmp_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string Tok() const { return "--tokenizer " + ShellQuote(dir_); }

  std::string dir_;
  fs::path tmp_;
};

TEST_F(TokenizeCliTest, EncodesLikeTheLibrary) {
  auto tok = HfTokenizer::LoadDir(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "<|im_start|>user\nHello, w\u00f6rld! \u4e2d\u6587 \U0001F600\t123<|im_end|>";
  const std::vector<int32_t> ids = tok->Encode(text);
  Result r = Run("tokenize " + Tok() + " --text " + ShellQuote(text));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, testing::IdsToString(ids) + "\n");
  // --output json, also given before the command as tandemctl's global flag.
  r = Run("tokenize " + Tok() + " --text=" + ShellQuote(text) + " --output json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(), ids);
  r = Run("--output json tokenize " + Tok() + " --text " + ShellQuote(text));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(), ids);
  // A file is read byte for byte (CRLF, tabs, no final newline), or stdin.
  const std::string file_text = "line one\r\n\tline two  \n\n  end";
  const std::string path = File("in.txt", file_text);
  r = Run("tokenize " + Tok() + " --text-file " + ShellQuote(path));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, testing::IdsToString(tok->Encode(file_text)) + "\n");
  r = Run("tokenize " + Tok() + " --text-file -", path);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, testing::IdsToString(tok->Encode(file_text)) + "\n");
  // The empty text has no ids.
  r = Run("tokenize " + Tok() + " --text ''");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "\n");
}

TEST_F(TokenizeCliTest, DecodesExactly) {
  auto tok = HfTokenizer::LoadDir(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "  indented\r\n\ttext with \u00e9 and \U0001F600\n\n";
  const std::vector<int32_t> ids = tok->Encode(text);
  const std::string spaced = testing::IdsToString(ids);
  std::string commas = spaced;
  for (char& c : commas) c = c == ' ' ? ',' : c;
  for (const std::string& input : {spaced, commas, nlohmann::json(ids).dump(), " " + spaced + "\n"}) {
    Result r = Run("tokenize " + Tok() + " --decode --text " + ShellQuote(input));
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, text) << "input " << input;  // no newline added
  }
  Result r = Run("tokenize " + Tok() + " --decode --text-file " + ShellQuote(File("ids", spaced)));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, text);
  r = Run("tokenize " + Tok() + " --decode --output json --text " + ShellQuote(spaced));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["text"], text);
  r = Run("tokenize " + Tok() + " --decode --text ''");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(TokenizeCliTest, ErrorsAreClear) {
  struct Case {
    std::string args;
    int rc;
    std::string message;
  };
  const std::string bad_utf8 = File("bad.txt", "ok \xff\xfe");
  const std::vector<Case> cases = {
      {"tokenize --text hi", 2, "--tokenizer is required"},
      {"tokenize " + Tok(), 2, "give exactly one of --text and --text-file"},
      {"tokenize " + Tok() + " --text a --text-file b", 2, "give exactly one of --text and --text-file"},
      {"tokenize " + Tok() + " --text a --output xml", 2, "--output must be text or json"},
      {"tokenize " + Tok() + " --text a --frobnicate", 2, "unknown flag '--frobnicate'"},
      {"tokenize " + Tok() + " --text", 2, "--text needs a value"},
      {"tokenize " + Tok() + " stray --text a", 2, "unexpected argument 'stray'"},
      {"tokenize --tokenizer /nonexistent/dir --text a", 1, "/nonexistent/dir does not exist"},
      {"tokenize " + Tok() + " --text-file /nonexistent/file", 2, "cannot read --text-file /nonexistent/file"},
      {"tokenize " + Tok() + " --text-file " + ShellQuote(bad_utf8), 2, "not valid UTF-8 (at byte 3)"},
      {"tokenize " + Tok() + " --decode --text '1 x 3'", 2, "\"x\" is not a token id"},
      {"tokenize " + Tok() + " --decode --text '1 -2'", 2, "id -2 is not a token of this tokenizer"},
      {"tokenize " + Tok() + " --decode --text 999999999", 2,
       "id 999999999 is not a token of this tokenizer (ids are 0..151668)"},
      {"tokenize " + Tok() + " --decode --text '[1, \"a\"]'", 2, "the JSON list holds \"a\", not an integer"},
      {"tokenize " + Tok() + " --decode --text '[1, 2'", 2, "not a JSON list"},
  };
  for (const Case& c : cases) {
    const Result r = Run(c.args);
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  // A tokenizer.json it refuses: exit 1, the reason on stderr.
  fs::create_directories(tmp_ / "bad");
  File("bad/tokenizer.json", R"({"model": {"type": "WordPiece"}})");
  const Result r = Run("tokenize --tokenizer " + ShellQuote((tmp_ / "bad").string()) + " --text a");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("model.type \"WordPiece\" is not supported"), std::string::npos) << r.err;
}

TEST_F(TokenizeCliTest, Help) {
  Result r = Run("tokenize --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("usage: tandemctl tokenize --tokenizer DIR"), std::string::npos) << r.out;
  r = Run("--help");
  EXPECT_NE(r.out.find("tokenize --tokenizer DIR"), std::string::npos);
}

}  // namespace
}  // namespace tandem::tokenizer
