// `model init` and `generate` commands: success paths and exit codes
// (0 ok, 1 runtime error, 2 usage error), through the functions tandemctl
// calls and through the tandem-model-tool binary.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/model/model_commands.h"
#include "worker/model/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

std::string RunTool(const std::string& args, int* rc) {
  const std::string cmd = std::string(TANDEM_MODEL_TOOL) + " " + args + " 2>/dev/null";
  FILE* f = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_cmd_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& f) const { return (dir_ / f).string(); }
  fs::path dir_;
};

TEST_F(CommandsTest, InitThenGenerate) {
  const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
  ASSERT_EQ(ModelInitCommand({"--config", tiny, "--seed", "3", "--out", P("m")}), 0);
  EXPECT_TRUE(fs::exists(P("m/model.safetensors")));
  EXPECT_TRUE(fs::exists(P("m/config.json")));
  EXPECT_TRUE(fs::exists(P("m/tokenizer.json")));
  auto loaded = LoadModelDir(P("m"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->tokenizer.has_value());
  // Same seed, same weights; JSON config input works too.
  ASSERT_EQ(ModelInitCommand({"--config=" + P("m/config.json"), "--seed=3", "--out=" + P("m2")}), 0);
  auto loaded2 = LoadModelDir(P("m2"));
  ASSERT_TRUE(loaded2.ok());
  EXPECT_EQ(loaded->params, loaded2->params);

  int rc = -1;
  std::string out =
      RunTool("generate --model " + P("m") + " --prompt '12+34=' --max-new-tokens 5 --output json --threads 1", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["prompt_ids"].size(), 7u);  // BOS + 6 chars
  ASSERT_EQ(j["samples"].size(), 1u);
  EXPECT_EQ(j["samples"][0]["ids"].size(), j["samples"][0]["raw_logprobs"].size());
  EXPECT_TRUE(j["samples"][0].contains("text"));
  out = RunTool("generate --model " + P("m") +
                    " --prompt-ids 1,5,6 --max-new-tokens 4 --temperature 0.7 --top-p 0.9"
                    " --top-k 10 --seed 5 --num-samples 3 --threads 1",
                &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("sample 2"), std::string::npos) << out;
  // Greedy samples of one prompt (one shared prefill) are the same, within
  // the KV cache reported.
  out = RunTool("generate --model " + P("m") + " --prompt-ids 1,5,6 --max-new-tokens 6 --num-samples 2 --output json" +
                    " --threads 1",
                &rc);
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out);
  ASSERT_EQ(j["samples"].size(), 2u);
  EXPECT_EQ(j["samples"][0]["ids"], j["samples"][1]["ids"]);
  EXPECT_GT(j["kv_peak_bytes"].get<double>(), 0);
  EXPECT_LE(j["kv_peak_bytes"].get<double>(), j["kv_cache_bytes"].get<double>());
}

// A model with a soft prompt (config.json tandem_soft_prompt_tokens):
// `model init` writes the tensor, and `generate` runs behind it.
TEST_F(CommandsTest, GenerateBehindASoftPrompt) {
  const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
  ASSERT_EQ(ModelInitCommand({"--config", tiny, "--seed", "3", "--out", P("m")}), 0);
  std::ifstream in(P("m/config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  c["tandem_soft_prompt_tokens"] = 3;
  std::ofstream(P("soft.json")) << c.dump();
  ASSERT_EQ(ModelInitCommand({"--config=" + P("soft.json"), "--seed=3", "--out=" + P("s")}), 0);
  auto loaded = LoadModelDir(P("s"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.tandem_soft_prompt_tokens, 3);
  int rc = -1;
  const std::string args = " --prompt-ids 1,5,6 --max-new-tokens 6 --output json --threads 1";
  std::string out = RunTool("generate --model " + P("s") + args, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto soft = nlohmann::json::parse(out);
  EXPECT_EQ(soft["soft_prompt_tokens"], 3);
  EXPECT_EQ(soft["prompt_ids"].size(), 3u);
  out = RunTool("generate --model " + P("m") + args, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto plain = nlohmann::json::parse(out);
  EXPECT_FALSE(plain.contains("soft_prompt_tokens"));
  // The same base weights (the seed draws the soft prompt last), so only
  // the soft prompt can change the log-probs.
  EXPECT_NE(soft["samples"][0]["raw_logprobs"], plain["samples"][0]["raw_logprobs"]);
}

TEST_F(CommandsTest, ExitCodes) {
  const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
  EXPECT_EQ(ModelInitCommand({"--help"}), 0);
  EXPECT_EQ(GenerateCommand({"--help"}), 0);
  EXPECT_EQ(ModelInitCommand({}), 2);
  EXPECT_EQ(ModelInitCommand({"--config", tiny}), 2);
  EXPECT_EQ(ModelInitCommand({"--config", tiny, "--out", P("x"), "--bogus", "1"}), 2);
  EXPECT_EQ(ModelInitCommand({"--config", tiny, "--out", P("x"), "--seed", "abc"}), 2);
  EXPECT_EQ(ModelInitCommand({"--config", P("missing.yaml"), "--out", P("x")}), 1);
  std::ofstream(P("bad.yaml")) << "vocab_size: 10\nhidden_size: 30\nnum_attention_heads: 4\n";
  EXPECT_EQ(ModelInitCommand({"--config", P("bad.yaml"), "--out", P("x")}), 1);
  std::ofstream(P("broken.yaml")) << "vocab_size: [1, 2\n";
  EXPECT_EQ(ModelInitCommand({"--config", P("broken.yaml"), "--out", P("x")}), 1);

  ASSERT_EQ(ModelInitCommand({"--config", tiny, "--out", P("m")}), 0);
  EXPECT_EQ(GenerateCommand({}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m")}), 2);  // no prompt
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--prompt-ids", "1"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt-ids", "1,x"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--greedy", "--temperature", "1"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--temperature", "0"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--top-p", "1.5"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--output", "xml"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("nope"), "--prompt", "a"}), 1);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt-ids", "1,500"}), 1);  // id out of vocab
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--sparse-top-k-blocks", "0"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--sparse-top-k-blocks", "x"}), 2);
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--sparse-block-size", "64"}), 2);
  EXPECT_EQ(
      GenerateCommand({"--model", P("m"), "--prompt", "a", "--sparse-top-k-blocks", "2", "--sparse-block-size", "40"}),
      2);
}

// --sparse-top-k-blocks: with more blocks than the sequence has, the dense
// tokens; with one chosen block of 16 over 24 positions, a generation.
TEST_F(CommandsTest, GenerateWithSparseAttention) {
  const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
  ASSERT_EQ(ModelInitCommand({"--config", tiny, "--seed", "3", "--out", P("m")}), 0);
  const std::string base =
      "generate --model " + P("m") + " --prompt-ids 1,5,6,7 --max-new-tokens 20 --output json" + " --threads 1";
  int rc = -1;
  auto ids = [&](const std::string& extra) {
    const std::string out = RunTool(base + extra, &rc);
    EXPECT_EQ(rc, 0) << out;
    return rc == 0 ? nlohmann::json::parse(out)["samples"][0]["ids"] : nlohmann::json();
  };
  const auto dense = ids("");
  EXPECT_EQ(ids(" --sparse-top-k-blocks 100"), dense);
  EXPECT_FALSE(ids(" --sparse-top-k-blocks 1 --sparse-block-size 16").empty());
}

// Configs that declare far more than they use: RoPE tables follow the
// positions in use, not max_position_embeddings (here 2^24 positions x a
// 1024-wide head would be 64 GB of tables), and an absurd --max-new-tokens
// is a clear error, not an int overflow.
TEST_F(CommandsTest, DeclaredSizesAreNotAllocatedUpFront) {
  std::ofstream(P("huge.yaml")) << "model_type: llama\ntokenizer: char\nvocab_size: 99\nhidden_size: 2048\n"
                                   "intermediate_size: 16\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
                                   "num_key_value_heads: 1\nmax_position_embeddings: 16777216\n"
                                   "bos_token_id: 1\neos_token_id: 2\npad_token_id: 0\n";
  ASSERT_EQ(ModelInitCommand({"--config", P("huge.yaml"), "--out", P("huge")}), 0);
  int rc = -1;
  std::string out =
      RunTool("generate --model " + P("huge") + " --prompt-ids 1,5,6 --max-new-tokens 3 --threads 1", &rc);
  EXPECT_EQ(rc, 0) << out;

  const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
  ASSERT_EQ(ModelInitCommand({"--config", tiny, "--out", P("m")}), 0);
  for (const char* n : {"2147483647", "2147483646", "4194304"}) {
    out = RunTool("generate --model " + P("m") + " --prompt-ids 1,5,6 --max-new-tokens " + n + " --threads 1", &rc);
    EXPECT_EQ(rc, 1) << n << ": " << out;
  }
  EXPECT_EQ(GenerateCommand({"--model", P("m"), "--prompt", "a", "--max-new-tokens", "99999999999"}), 2);
}

}  // namespace
}  // namespace tandem::model
