// Hugging Face compatibility: tests/model/hf_reference.py writes checkpoints
// the way HF tools do (F32, BF16, F16; Llama, Mistral, Qwen2 and Qwen3
// layouts; linear, dynamic, YaRN and Llama 3 RoPE; sliding windows; tied and
// untied heads) and computes logits with a pure-PyTorch float64 forward
// following transformers' modeling code. We load the directory and compare
// logits (both sequences packed in one batch). Needs /usr/bin/python3 with torch and numpy (python3-torch,
// python3-numpy: deploy/install-deps.sh --for-tests); without them the tests
// fail and name the package.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
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

// Relative error bounds (of the largest logit): the reference backend
// accumulates in double; the CPU backend in fp32 with OpenBLAS, whose sums
// depend on its kernel (measured: 3e-7 and 1e-6 at most).
constexpr double kRefTol = 2e-6;
constexpr double kCpuTol = 2e-5;

class HfCompatTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Runs hf_reference.py for `variant` (once per process). Returns "" when
  // it wrote the directory, else why not (with the package to install when
  // a dependency is missing).
  static std::string Make(const std::string& variant) {
    if (made_.count(variant)) return made_[variant];
    if (!fs::exists("/usr/bin/python3")) {
      return made_[variant] =
                 "/usr/bin/python3 not found: install python3: deploy/install-deps.sh --for-tests";
    }
    if (dir_.empty()) {
      dir_ = fs::temp_directory_path() / ("tandem_hf_" + std::to_string(::getpid()));
      fs::remove_all(dir_);
    }
    const std::string cmd = std::string("/usr/bin/python3 ") + TANDEM_SOURCE_DIR +
                            "/tests/model/hf_reference.py make " + dir_.string() + " " +
                            variant + " 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) return made_[variant] = "popen failed: " + cmd;
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    const int rc = ::pclose(f);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return made_[variant] = "";
    // A missing module (exit 3) prints one line naming the package.
    const std::string how = WIFEXITED(rc) ? "exit " + std::to_string(WEXITSTATUS(rc))
                                          : "status " + std::to_string(rc);
    return made_[variant] = "hf_reference.py " + variant + " failed (" + how + "): " + out;
  }

  // Compares the logits of the model in DIR/variant with reference.json:
  // max |logit - reference| / max |reference logit| < tol. `edit` may change
  // the loaded config first (to show that a setting matters; no bound then).
  // Returns that relative error (-1 on failure).
  double Check(const std::string& variant, kernels::Ops* ops, double tol,
               const std::function<void(ModelConfig&)>& edit = nullptr) {
    double max_diff = -1;
    CheckImpl(variant, ops, tol, edit, &max_diff);
    return max_diff;
  }

  void CheckImpl(const std::string& variant, kernels::Ops* ops, double tol,
                 const std::function<void(ModelConfig&)>& edit, double* result) {
    const std::string error = Make(variant);
    ASSERT_TRUE(error.empty()) << error;
    const std::string d = (dir_ / variant).string();
    auto loaded = LoadModelDir(d);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    if (edit) edit(loaded->config);
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
    std::printf("[hf %s, %s ops%s] max |logit - torch| = %.3g, relative to max |logit| "
                "(%.3g) %.3g\n",
                variant.c_str(), ops->name(), edit ? ", edited config" : "", max_diff,
                max_abs, max_diff / max_abs);
    if (!edit) EXPECT_LT(max_diff / max_abs, tol);
    *result = max_diff / max_abs;
  }

  static inline std::map<std::string, std::string> made_;
  static inline fs::path dir_;
};

TEST_F(HfCompatTest, LlamaF32Untied) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_f32", ops.get(), kRefTol);
  auto cpu = kernels::MakeCpuOps(0);
  Check("llama_f32", cpu.get(), kCpuTol);
}

TEST_F(HfCompatTest, Qwen2Bf16TiedBiasLinearRopeSlidingWindow) {
  auto ops = kernels::MakeReferenceOps();
  Check("qwen2_bf16", ops.get(), kRefTol);
}

TEST_F(HfCompatTest, LlamaF16YarnMqa) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_yarn_f16", ops.get(), kRefTol);
}

TEST_F(HfCompatTest, LlamaDynamicNtkBeyondMaxPositions) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama_dynamic_f32", ops.get(), kRefTol);
}

TEST_F(HfCompatTest, MistralSlidingWindowOnEveryLayer) {
  auto ops = kernels::MakeReferenceOps();
  Check("mistral_bf16", ops.get(), kRefTol);
  auto cpu = kernels::MakeCpuOps(0);
  Check("mistral_bf16", cpu.get(), kCpuTol);
  // The window matters: without it the logits differ.
  const double full = Check("mistral_bf16", ops.get(), 0, [](ModelConfig& c) {
    c.sliding_window = 0;
  });
  EXPECT_GT(full, 1e-1);
}

TEST_F(HfCompatTest, Qwen3TiedQkNormHeadDim) {
  auto ops = kernels::MakeReferenceOps();
  Check("qwen3_tied_bf16", ops.get(), kRefTol);
  auto cpu = kernels::MakeCpuOps(0);
  Check("qwen3_tied_bf16", cpu.get(), kCpuTol);
}

TEST_F(HfCompatTest, Qwen3UntiedQkNormSlidingWindow) {
  auto ops = kernels::MakeReferenceOps();
  Check("qwen3_untied_f32", ops.get(), kRefTol);
  auto cpu = kernels::MakeCpuOps(0);
  Check("qwen3_untied_f32", cpu.get(), kCpuTol);
}

TEST_F(HfCompatTest, Llama3RopeScalingPastOriginalContext) {
  auto ops = kernels::MakeReferenceOps();
  Check("llama3_bf16", ops.get(), kRefTol);
  auto cpu = kernels::MakeCpuOps(0);
  Check("llama3_bf16", cpu.get(), kCpuTol);
  // The scaling matters at these positions: without it, or with HF's
  // default-only frequencies divided by the factor (linear), the logits
  // are far off.
  const double unscaled = Check("llama3_bf16", ops.get(), 0, [](ModelConfig& c) {
    c.has_rope_scaling = false;
  });
  EXPECT_GT(unscaled, 1e-1);
  const double linear = Check("llama3_bf16", ops.get(), 0, [](ModelConfig& c) {
    c.rope_scaling.rope_type = "linear";
  });
  EXPECT_GT(linear, 1e-1);
}

}  // namespace
}  // namespace tandem::model
