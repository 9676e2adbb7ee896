// PHASE_EXPORT of a job whose model came from a Hugging Face directory
// (model.from): two ranks under ZeRO-3 gather the parameters, rank 0 writes
// the directory. Right after SETUP the export holds the source's parameters
// bit for bit; the source's tokenizer files are copied through and its
// generation_config.json kept (with the config's ids added); after a
// training step the export holds the trained weights.
#include <cstring>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/engine/engine_test_util.h"
#include "worker/model/config.h"
#include "worker/model/file_util.h"
#include "worker/model/model.h"
#include "worker/model/tokenizer.h"

namespace tandem::enginetest {
namespace {

using nlohmann::json;

std::string Read(const std::string& path) {
  auto text = model::ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ExportTest, ModelFromDirectoryExportsCompleteHfDirectory) {
  const std::string dir = MakeTempDir("export");
  const std::string src = dir + "/source", out = dir + "/final";
  // A Qwen3 model (q/k norms, head_dim 12 against hidden 32 / 4 heads) with
  // the built-in char tokenizer.
  auto config = model::ParseConfigJson(json{
      {"model_type", "qwen3"},
      {"vocab_size", 99},
      {"hidden_size", 32},
      {"intermediate_size", 64},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"head_dim", 12},
      {"max_position_embeddings", 32},
      {"tokenizer", "char"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"pad_token_id", 0},
      {"tie_word_embeddings", false}}.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  model::Model m(*config, nullptr);
  std::vector<float> params(m.layout().total_floats());
  m.InitParams(17, params.data());
  const model::CharTokenizer chars = model::CharTokenizer::Default();
  ASSERT_TRUE(model::SaveModelDir(src, *config, params.data(), &chars).ok());
  const std::string tokenizer_config = R"({"tokenizer_class": "PreTrainedTokenizerFast"})";
  const std::string special_tokens = R"({"eos_token": "<eos>"})";
  std::ofstream(src + "/tokenizer_config.json") << tokenizer_config;
  std::ofstream(src + "/special_tokens_map.json") << special_tokens;
  std::ofstream(src + "/generation_config.json") << R"({"temperature": 0.6})";

  const JobSpec spec = ParseSpec(R"(
name: export-test
kind: sft
seed: 3
task: {name: arithmetic, op: add, digits: 1, eval_size: 8}
train: {steps: 1, lr: 1.0e-2, global_batch: 4, micro_batch: 2, warmup_steps: 0, seq_len: 16}
cluster: {workers: 2, zero_stage: 3, threads_per_worker: 1}
checkpoint: {every: 0, keep: 1}
)",
                                 {"model.from=" + src, "output_dir=" + out});
  EngineCluster cluster(2);
  cluster.SetupOk(spec);
  cluster.RunOk(tandem::v1::PHASE_EXPORT, 0);

  auto exported = model::LoadModelDir(out);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->params.size(), params.size());
  EXPECT_EQ(0, std::memcmp(exported->params.data(), params.data(), params.size() * 4));
  EXPECT_TRUE(exported->tokenizer.has_value());
  EXPECT_EQ(Read(out + "/tokenizer.json"), Read(src + "/tokenizer.json"));
  EXPECT_EQ(Read(out + "/tokenizer_config.json"), tokenizer_config);
  EXPECT_EQ(Read(out + "/special_tokens_map.json"), special_tokens);
  const json gen = json::parse(Read(out + "/generation_config.json"));
  EXPECT_EQ(gen, (json{{"temperature", 0.6}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"pad_token_id", 0}}));
  const json cfg = json::parse(Read(out + "/config.json"));
  EXPECT_EQ(cfg["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(cfg["head_dim"], 12);
  EXPECT_EQ(cfg["torch_dtype"], "float32");

  // After a step: the trained weights, the same files.
  cluster.RunOk(tandem::v1::PHASE_SFT_STEP, 1);
  cluster.RunOk(tandem::v1::PHASE_EXPORT, 1);
  auto trained = model::LoadModelDir(out);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_GT(MaxAbsDiff(trained->params, params), 1e-4);
  const model::TensorView* qn = m.layout().Find("model.layers.1.self_attn.q_norm.weight");
  ASSERT_NE(qn, nullptr);
  bool q_norm_trained = false;
  for (size_t i = 0; i < qn->numel; ++i) {
    q_norm_trained |= trained->params[qn->offset + i] != params[qn->offset + i];
  }
  EXPECT_TRUE(q_norm_trained);
  EXPECT_EQ(Read(out + "/tokenizer_config.json"), tokenizer_config);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::enginetest
