// `generate --context-embeddings FILE`: the model's own embedding rows of
// the first prompt tokens, given as context, generate what the whole token
// prompt does (F32 and BF16 files); bad files fail with exit code 1 and a
// message naming the problem.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/model/context_embeddings.h"
#include "worker/model/model_commands.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

std::string RunTool(const std::string& args, int* rc, bool with_stderr = false) {
  const std::string cmd = std::string(TANDEM_MODEL_TOOL) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* f = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class ContextEmbeddingsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_ctx_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const std::string tiny = std::string(TANDEM_SOURCE_DIR) + "/configs/models/tiny.yaml";
    ASSERT_EQ(ModelInitCommand({"--config", tiny, "--seed", "3", "--out", P("m")}), 0);
    auto loaded = LoadModelDir(P("m"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    model_ = std::move(*loaded);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& f) const { return (dir_ / f).string(); }
  // The embedding rows of `ids`.
  std::vector<float> Rows(const std::vector<int32_t>& ids) const {
    const ParamLayout layout(model_.config);
    const size_t C = model_.config.hidden_size;
    const float* embed = model_.params.data() + layout.unit_offset(0) + layout.embed_offset();
    std::vector<float> out;
    for (int32_t t : ids) out.insert(out.end(), embed + t * C, embed + (t + 1) * C);
    return out;
  }
  std::string Write(const std::string& name, const std::vector<float>& rows, std::vector<int64_t> shape,
                    StDtype dtype = StDtype::kF32) {
    EXPECT_TRUE(WriteSafetensors(P(name), {{"context", shape, rows.data()}}, {}, dtype).ok());
    return P(name);
  }
  nlohmann::json Generate(const std::string& flags) {
    int rc = -1;
    const std::string out =
        RunTool("generate --model " + P("m") + " " + flags + " --max-new-tokens 6 --output json --threads 1", &rc);
    EXPECT_EQ(rc, 0) << flags;
    return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json();
  }
  fs::path dir_;
  LoadedModel model_;
};

TEST_F(ContextEmbeddingsCliTest, EmbeddingRowsGenerateWhatTheirTokensDo) {
  const std::vector<int32_t> prompt = {1, 20, 21, 13, 22, 23, 15};
  const int64_t C = model_.config.hidden_size;
  const nlohmann::json want = Generate("--prompt-ids 1,20,21,13,22,23,15");
  ASSERT_TRUE(want.contains("samples"));
  std::vector<int32_t> want_ids = want["samples"][0]["ids"];
  // 3 rows + the rest as ids; 7 rows and no ids; the same from BF16 rows
  // (the embedding rounded to bf16 is no longer the model's row, so BF16
  // is checked against the same BF16 rows given twice).
  const std::string three = Write("three.safetensors", Rows({1, 20, 21}), {3, C});
  const nlohmann::json a = Generate("--context-embeddings " + three + " --prompt-ids 13,22,23,15");
  EXPECT_EQ(a["context_rows"], 3);
  EXPECT_EQ(a["samples"][0]["ids"].get<std::vector<int32_t>>(), want_ids);
  const std::string all = Write("all.safetensors", Rows(prompt), {7, C});
  const nlohmann::json b = Generate("--context-embeddings " + all);
  EXPECT_EQ(b["samples"][0]["ids"].get<std::vector<int32_t>>(), want_ids);
  EXPECT_EQ(b["samples"][0]["raw_logprobs"], a["samples"][0]["raw_logprobs"]);
  const std::string bf16 = Write("bf16.safetensors", Rows(prompt), {7, C}, StDtype::kBF16);
  auto rows = LoadContextEmbeddings(bf16, static_cast<int>(C));
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (size_t i = 0; i < rows->size(); ++i) ASSERT_EQ((*rows)[i], Bf16ToF32(F32ToBf16(Rows(prompt)[i])));
  const nlohmann::json c = Generate("--context-embeddings " + bf16 + " --num-samples 2");
  ASSERT_EQ(c["samples"].size(), 2u);
  EXPECT_EQ(c["samples"][0]["ids"], c["samples"][1]["ids"]);  // greedy
}

TEST_F(ContextEmbeddingsCliTest, BadFilesAreClearErrors) {
  const int64_t C = model_.config.hidden_size;
  auto error_of = [&](const std::string& file) {
    int rc = -1;
    const std::string out = RunTool("generate --model " + P("m") + " --context-embeddings " + file +
                                        " --prompt-ids 1 --max-new-tokens 2 --threads 1",
                                    &rc, /*with_stderr=*/true);
    EXPECT_EQ(rc, 1) << out;
    return out;
  };
  EXPECT_NE(error_of(Write("hidden.safetensors", std::vector<float>(3 * (C + 1), 0.1f), {3, C + 1}))
                .find("the model's hidden size is " + std::to_string(C)),
            std::string::npos);
  {
    // An F16 tensor, written by hand (the writer makes F32 and BF16 only).
    const std::string header = "{\"context\":{\"dtype\":\"F16\",\"shape\":[1," + std::to_string(C) +
                               "],\"data_offsets\":[0," + std::to_string(2 * C) + "]}}";
    std::FILE* f = std::fopen(P("f16.safetensors").c_str(), "wb");
    const uint64_t len = header.size();
    std::fwrite(&len, sizeof len, 1, f);
    std::fwrite(header.data(), 1, header.size(), f);
    const std::vector<uint16_t> zeros(C, 0);
    std::fwrite(zeros.data(), sizeof(uint16_t), zeros.size(), f);
    std::fclose(f);
    EXPECT_NE(error_of(P("f16.safetensors")).find("is F16; expected F32 or BF16"), std::string::npos);
  }
  EXPECT_NE(error_of(Write("flat.safetensors", Rows({1, 2}), {2 * C})).find("1 dimensions"), std::string::npos);
  std::vector<float> nan = Rows({1, 2});
  nan[C + 4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of(Write("nan.safetensors", nan, {2, C})).find("row 1, column 4 is nan"), std::string::npos);
  std::vector<float> inf = Rows({1});
  inf[0] = std::numeric_limits<float>::infinity();
  EXPECT_NE(error_of(Write("inf.safetensors", inf, {1, C})).find("must be finite"), std::string::npos);
  const std::vector<float> two = Rows({1, 2});
  ASSERT_TRUE(
      WriteSafetensors(P("two.safetensors"), {{"a", {1, C}, two.data()}, {"b", {1, C}, two.data() + C}}, {}).ok());
  EXPECT_NE(error_of(P("two.safetensors")).find("holds 2 tensors"), std::string::npos);
  EXPECT_NE(error_of(P("missing.safetensors")).find("missing.safetensors"), std::string::npos);
  // Too many rows for the model's context (tiny: max_position_embeddings).
  const int n = model_.config.max_position_embeddings;
  EXPECT_NE(error_of(Write("long.safetensors", std::vector<float>(static_cast<size_t>(n) * C, 0.1f), {n, C}))
                .find("exceed the model's context"),
            std::string::npos);
  std::FILE* junk = std::fopen(P("junk.safetensors").c_str(), "wb");
  std::fputs("not a safetensors file", junk);
  std::fclose(junk);
  EXPECT_NE(error_of(P("junk.safetensors")).find("junk.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace tandem::model
