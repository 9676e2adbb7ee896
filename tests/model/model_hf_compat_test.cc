// Hugging Face compatibility: tests/model/hf_reference.py writes checkpoints
// the way HF tools do (F32, BF16, F16; Llama and Qwen2 layouts; linear and
// YaRN RoPE; a sliding-window layer; tied and untied heads) and computes
// logits with a pure-PyTorch forward following transformers' modeling code.
// We load the directory and compare logits (both sequences packed in one
// batch). Skips when /usr/bin/python3 has no torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <sys/wait.h>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_util.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

namespace tandem::model {
namespace {

namespace fs = std::filesystem;

class HfCompatTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Runs hf_reference.py for `variant` (once per process). Returns false
  // and sets skip_ when torch is missing.
  static bool Make(const std::string& variant) {
    if (made_.count(variant)) return made_[variant];
    if (!fs::exists("/usr/bin/python3")) {
      skip_ = true;
      return false;
    }
    if (dir_.empty()) {
      dir_ = fs::temp_directory_path() / ("tandem_hf_" + std::to_string(::getpid()));
      fs::remove_all(dir_);
    }
    const std::string cmd = std::string("/usr/bin/python3 ") + TANDEM_SOURCE_DIR +
                            "/tests/model/hf_reference.py make " + dir_.string() + " " + variant;
    const int rc = std::system(cmd.c_str());
    // The script exits 77 when torch is missing.
    skip_ = WIFEXITED(rc) && WEXITSTATUS(rc) == 77;
    return made_[variant] = rc == 0;
  }

  void Check(const std::string& variant, kernels::Ops* ops, double tol) {
    const bool made = Make(variant);
    if (skip_) GTEST_SKIP() << "/usr/bin/python3 has no torch: HF reference skipped";
    ASSERT_TRUE(made) << "hf_reference.py failed";
    const std::string d = (dir_ / variant).string();
    auto loaded = LoadModelDir(d);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    auto text = ReadFileToString(d + "/reference.json");
    ASSERT_TRUE(text.ok());
    auto ref = nlohmann::json::parse(*text);
    Batch b;
    b.cu_seqlens = {0};
    for (const auto& seq : ref["sequences"]) {
      int pos = 0;
      for (int id : seq) {
        b.tokens.push_back(id);
        b.targets.push_back(0);
        b.positions.push_back(pos++);
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    }
    const int V = loaded->config.vocab_size;
    Model model(loaded->config, ops);
    FlatParamProvider pp(model.layout(), loaded->params.data(), nullptr);
    std::vector<float> logits(b.tokens.size() * V);
    ASSERT_TRUE(model.ForwardLogits(b, pp, logits.data()).ok());
    double max_diff = 0, max_abs = 0;
    size_t row = 0;
    for (const auto& seq_logits : ref["logits"]) {
      for (const auto& r : seq_logits) {
        for (int v = 0; v < V; ++v) {
          const double want = r[v].get<double>();
          max_diff = std::max(max_diff, std::fabs(want - logits[row * V + v]));
          max_abs = std::max(max_abs, std::fabs(want));
        }
        ++row;
      }
    }
    ASSERT_EQ(row, b.tokens.size());
    std::printf("[hf %s, %s ops] max |logit - torch| = %.3g (max |logit| %.3g)\n",
                variant.c_str(), ops->name(), max_diff, max_abs);
    EXPECT_LT(max_diff, tol);
  }

  static inline bool skip_ = false;
  static inline std::map<std::string, bool> made_;
  static inline fs::path dir_;
};

TEST_F(HfCompatTest, LlamaF32Untied) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_f32", ops.get(), 1e-4);
  auto cpu = kernels::MakeCpuOps(0);
  Check("llama_f32", cpu.get(), 1e-3);
}

TEST_F(HfCompatTest, Qwen2Bf16TiedBiasLinearRopeSlidingWindow) {
  auto ops = kernels::MakeReferenceOps();
  Check("qwen2_bf16", ops.get(), 1e-4);
}

TEST_F(HfCompatTest, LlamaF16YarnMqa) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_yarn_f16", ops.get(), 1e-4);
}

TEST_F(HfCompatTest, LlamaDynamicNtkBeyondMaxPositions) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_dynamic_f32", ops.get(), 1e-4);
}

}  // namespace
}  // namespace tandem::model
