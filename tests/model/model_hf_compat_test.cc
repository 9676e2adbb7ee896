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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <vector>

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
    return made_[variant] = RunReference("make " + Dir().string() + " " + variant);
  }

  // The suite's scratch directory (removed after the suite).
  static const fs::path& Dir() {
    if (dir_.empty()) {
      dir_ = fs::temp_directory_path() / ("tandem_hf_" + std::to_string(::getpid()));
      fs::remove_all(dir_);
      fs::create_directories(dir_);
    }
    return dir_;
  }

  // Runs hf_reference.py with `args`: "" on success, else why not.
  static std::string RunReference(const std::string& args) {
    if (!fs::exists("/usr/bin/python3")) {
      return "/usr/bin/python3 not found: install python3: deploy/install-deps.sh --for-tests";
    }
    const std::string cmd =
        std::string("/usr/bin/python3 ") + TANDEM_SOURCE_DIR + "/tests/model/hf_reference.py " + args + " 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) return "popen failed: " + cmd;
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    const int rc = ::pclose(f);
    if (WIFEXITED(rc) && WEXITSTATUS(rc) == 0) return "";
    // A missing module (exit 3) prints one line naming the package.
    const std::string how = WIFEXITED(rc) ? "exit " + std::to_string(WEXITSTATUS(rc)) : "status " + std::to_string(rc);
    return "hf_reference.py " + args + " failed (" + how + "): " + out;
  }

  // Full logits [T, V] of `seqs` packed in one batch.
  static std::vector<float> Logits(const LoadedModel& m, kernels::Ops* ops, const nlohmann::json& seqs) {
    Batch b;
    b.cu_seqlens = {0};
    for (const auto& seq : seqs) {
      int pos = 0;
      for (int id : seq) {
        b.tokens.push_back(id);
        b.targets.push_back(0);
        b.positions.push_back(pos++);
      }
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    }
    Model model(m.config, ops);
    std::vector<float> params = m.params;
    FlatParamProvider pp(model.layout(), params.data(), nullptr);
    std::vector<float> logits(b.tokens.size() * m.config.vocab_size);
    EXPECT_TRUE(model.ForwardLogits(b, pp, logits.data()).ok());
    return logits;
  }

  // max |a - ref| / max |ref| over reference logits [[[V] per position] per
  // sequence] against packed rows.
  static double RelativeError(const nlohmann::json& ref, const std::vector<float>& logits, int V,
                              double* max_abs_out = nullptr) {
    double max_diff = 0, max_abs = 0;
    size_t row = 0;
    for (const auto& seq_logits : ref) {
      for (const auto& r : seq_logits) {
        for (int v = 0; v < V; ++v) {
          const double want = r[v].get<double>();
          max_diff = std::max(max_diff, std::fabs(want - logits[row * V + v]));
          max_abs = std::max(max_abs, std::fabs(want));
        }
        ++row;
      }
    }
    EXPECT_EQ(row * V, logits.size());
    if (max_abs_out != nullptr) *max_abs_out = max_abs;
    return max_diff / max_abs;
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
    const std::string d = (Dir() / variant).string();
    auto loaded = LoadModelDir(d);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    if (edit) edit(loaded->config);
    auto text = ReadFileToString(d + "/reference.json");
    ASSERT_TRUE(text.ok());
    auto ref = nlohmann::json::parse(*text);
    const std::vector<float> logits = Logits(*loaded, ops, ref["sequences"]);
    double max_abs = 0;
    const double rel = RelativeError(ref["logits"], logits, loaded->config.vocab_size, &max_abs);
    std::printf("[hf %s, %s ops%s] max |logit - torch| relative to max |logit| (%.3g): %.3g\n", variant.c_str(),
                ops->name(), edit ? ", edited config" : "", max_abs, rel);
    if (!edit) EXPECT_LT(rel, tol);
    *result = rel;
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
  const double full = Check("mistral_bf16", ops.get(), 0, [](ModelConfig& c) { c.sliding_window = 0; });
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
  const double unscaled = Check("llama3_bf16", ops.get(), 0, [](ModelConfig& c) { c.has_rope_scaling = false; });
  EXPECT_GT(unscaled, 1e-1);
  const double linear = Check("llama3_bf16", ops.get(), 0, [](ModelConfig& c) { c.rope_scaling.rope_type = "linear"; });
  EXPECT_GT(linear, 1e-1);
}

// Export: each model is changed (so the reference must read the new
// weights), saved by SaveModelDir as shards (a small limit) with its source
// directory's files; it loads back into Tandem with identical parameters and
// config, and hf_reference.py, reading the exported directory as HF would,
// computes the same logits.
TEST_F(HfCompatTest, ExportLoadsBackIdenticallyAndIntoTheReference) {
  const std::vector<std::string> variants = {"qwen3_tied_bf16", "qwen3_untied_f32", "llama3_bf16", "mistral_bf16"};
  auto ops = kernels::MakeReferenceOps();
  std::string dirs;
  std::vector<LoadedModel> exported;
  std::vector<nlohmann::json> sequences;
  for (const std::string& v : variants) {
    const std::string error = Make(v);
    ASSERT_TRUE(error.empty()) << error;
    const fs::path src = Dir() / v;
    std::ofstream(src / "tokenizer_config.json") << R"({"model_max_length": 512})";
    auto m = LoadModelDir(src.string());
    ASSERT_TRUE(m.ok()) << m.status();
    for (size_t i = 0; i < m->params.size(); ++i) {
      m->params[i] += 0.01f * static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    }
    const fs::path out = Dir() / ("export_" + v);
    SaveOptions save;
    save.max_shard_bytes = 20000;
    save.source_dir = src.string();
    ASSERT_TRUE(SaveModelDir(out.string(), m->config, m->params.data(), nullptr, save).ok());
    EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json")) << v;
    EXPECT_TRUE(fs::exists(out / "generation_config.json")) << v;
    EXPECT_EQ(*ReadFileToString((out / "tokenizer_config.json").string()), R"({"model_max_length": 512})");
    auto back = LoadModelDir(out.string());
    ASSERT_TRUE(back.ok()) << back.status();
    // The whole flat buffer, padding (zeros on both sides) included.
    ASSERT_EQ(back->params.size(), m->params.size());
    EXPECT_EQ(0, std::memcmp(back->params.data(), m->params.data(), m->params.size() * 4)) << v;
    EXPECT_EQ(back->config.torch_dtype, "float32") << v;  // the weights as written
    back->config.torch_dtype = m->config.torch_dtype;
    EXPECT_EQ(ToConfigJson(back->config), ToConfigJson(m->config)) << v;
    auto ref = nlohmann::json::parse(*ReadFileToString((src / "reference.json").string()));
    std::ofstream(out / "sequences.json") << ref["sequences"].dump();
    sequences.push_back(ref["sequences"]);
    exported.push_back(*std::move(back));
    dirs += " " + out.string();
  }
  const std::string error = RunReference("logits" + dirs);
  ASSERT_TRUE(error.empty()) << error;
  for (size_t k = 0; k < variants.size(); ++k) {
    const fs::path out = Dir() / ("export_" + variants[k]);
    auto ref = nlohmann::json::parse(*ReadFileToString((out / "logits.json").string()));
    const std::vector<float> logits = Logits(exported[k], ops.get(), sequences[k]);
    const double rel = RelativeError(ref["logits"], logits, exported[k].config.vocab_size);
    std::printf("[hf export %s] max |logit - torch(exported dir)| relative: %.3g\n", variants[k].c_str(), rel);
    EXPECT_LT(rel, kRefTol) << variants[k];
  }
}

}  // namespace
}  // namespace tandem::model
