#include "common/job_spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/daemon_config.h"
#include "common/logging.h"
#include "spdlog/spdlog.h"
#include "worker/model/job_model.h"

namespace tandem::common {
namespace {

const char kIssueExample[] = R"(
name: grpo-arith-tiny
kind: grpo
seed: 1
model: {config: {vocab_size: 128, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                 num_attention_heads: 4, num_key_value_heads: 2, rope_theta: 10000.0}}
task: {name: arithmetic, op: add, digits: 2}
train: {steps: 200, lr: 1.0e-4, global_batch: 32, micro_batch: 8, warmup_steps: 10}
rl: {group_size: 8, prompts_per_step: 16, clip: 0.2, kl_coef: 0.01, max_new_tokens: 8, temperature: 1.0}
init: {sft: {steps: 50, lr: 3e-4}}
cluster: {workers: 2, device: cpu, zero_stage: 2}
checkpoint: {every: 20, keep: 3}
)";

std::string ErrorOf(const std::string& text, std::vector<std::string> overrides = {}) {
  auto spec = ParseJobSpecYaml(text, overrides);
  if (spec.ok()) return "OK";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

TEST(JobSpecTest, IssueExampleParses) {
  auto spec = ParseJobSpecYaml(kIssueExample);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind(), tandem::v1::JOB_KIND_GRPO);
  EXPECT_EQ(spec->train().steps(), 200);
  EXPECT_EQ(spec->cluster().workers(), 2);
  EXPECT_EQ(spec->cluster().device(), tandem::v1::DEVICE_KIND_CPU);
  EXPECT_EQ(spec->init().sft_steps(), 50);
  EXPECT_DOUBLE_EQ(spec->init().sft_lr(), 3e-4);
  EXPECT_EQ(spec->model().config().num_key_value_heads(), 2);
  EXPECT_DOUBLE_EQ(spec->model().config().rms_norm_eps(), 1e-5);  // default
  EXPECT_DOUBLE_EQ(spec->train().beta2(), 0.95);                  // default
  EXPECT_DOUBLE_EQ(spec->rl().clip_high(), 0.2);                  // derived
}

TEST(JobSpecTest, OverridesAndRoundTrip) {
  auto spec = ParseJobSpecYaml(kIssueExample, {"train.steps=10", "cluster.workers=4", "rl.kl_coef=0", "task.op=mul"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train().steps(), 10);
  EXPECT_EQ(spec->cluster().workers(), 4);
  EXPECT_EQ(spec->rl().kl_coef(), 0);  // explicit zero stays
  EXPECT_EQ(spec->task().op(), "mul");
  auto again = ParseJobSpecYaml(JobSpecToYaml(*spec));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << JobSpecToYaml(*spec);
  EXPECT_EQ(again->SerializeAsString(), spec->SerializeAsString());
  EXPECT_EQ(ErrorOf(kIssueExample, {"train"}), "--set 'train': expected key.path=value");
  EXPECT_EQ(ErrorOf(kIssueExample, {"train.steps.x=1"}), "--set train.steps.x: train.steps is not a map");
}

TEST(JobSpecTest, BadInputsNameTheField) {
  const std::string base = kIssueExample;
  EXPECT_NE(ErrorOf("kind: [sft").find("malformed YAML: line 1"), std::string::npos) << ErrorOf("kind: [sft");
  EXPECT_EQ(ErrorOf(base, {"train.stepz=3"}).rfind("train.stepz: unknown key; allowed: steps, lr, global_batch", 0),
            0u);
  EXPECT_EQ(ErrorOf(base, {"train.steps=abc"}), "train.steps: expected an integer, got 'abc'");
  EXPECT_EQ(ErrorOf(base, {"train.steps=1.5"}), "train.steps: expected an integer, got '1.5'");
  EXPECT_EQ(ErrorOf(base, {"train.lr=fast"}), "train.lr: expected a number, got 'fast'");
  EXPECT_EQ(ErrorOf(base, {"train={a: 1}"}).substr(0, 29), "train.a: unknown key; allowed");
  EXPECT_EQ(ErrorOf(base, {"train=[1, 2]"}), "train: expected a map, got a list");
  EXPECT_EQ(ErrorOf(base, {"train.steps=0"}), "train.steps: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf(base, {"train.steps=-5"}), "train.steps: must be >= 1, got -5");
  EXPECT_EQ(ErrorOf(base, {"train.steps=99999999999"}), "train.steps: must be <= 2147483647, got 99999999999");
  EXPECT_EQ(ErrorOf(base, {"train.steps=2000000000"}), "train.steps: must be <= 1000000000, got 2000000000");
  EXPECT_EQ(ErrorOf(base, {"cluster.workers=100000"}), "cluster.workers: must be <= 4096, got 100000");
  EXPECT_EQ(ErrorOf(base, {"train.lr=0"}), "train.lr: must be > 0, got 0");
  EXPECT_EQ(ErrorOf(base, {"train.lr=.inf"}), "train.lr: must be a finite number, got '.inf'");
  EXPECT_EQ(ErrorOf(base, {"cluster.device=tpu"}), "cluster.device: 'tpu' is not allowed; allowed: cpu, cuda");
  EXPECT_EQ(ErrorOf(base, {"kind=ppo"}), "kind: 'ppo' is not supported yet; allowed: sft, grpo");
  EXPECT_EQ(ErrorOf(base, {"init.sft.stepz=1"}), "init.sft.stepz: unknown key; allowed: lr, steps, stop_accuracy");
  EXPECT_EQ(ErrorOf(base, {"init.sft.stop_accuracy=1.5"}), "init.sft.stop_accuracy: must be <= 1, got 1.5");
  EXPECT_EQ(ErrorOf(base, {"init.sft.steps=0", "init.sft.stop_accuracy=0.3"}),
            "init.sft.stop_accuracy: needs a warm start: set init.sft.steps");
  EXPECT_EQ(ErrorOf(base, {"init.sft.stop_accuracy=0.3"}), "OK");
  EXPECT_EQ(ErrorOf(base, {"task.partial_reward=2"}), "task.partial_reward: must be <= 1, got 2");
  EXPECT_EQ(ErrorOf(base, {"init.sft.steps=-1"}), "init.sft.steps: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf(base, {"task.op=sub"}), "task.op: 'sub' is not allowed; allowed: \"\", add, mul");
  std::string megabyte(1 << 20, 'x');
  EXPECT_EQ(ErrorOf(base + "\noutput_dir: " + megabyte + "\n"), "output_dir: too long (1048576 chars; at most 4096)");
  EXPECT_EQ(ErrorOf(std::string(5 << 20, '#')), "job file: too large (5242880 bytes; at most 4194304)");
  EXPECT_EQ(ErrorOf(base, {"output_dir=/tmp/\xff"}), "output_dir: is not valid UTF-8");
  EXPECT_EQ(ErrorOf(base, {"name=bad name!"}), "name: 'bad name!' must be 1-128 characters of A-Z a-z 0-9 . _ -");
  EXPECT_EQ(ErrorOf(base, {"train.global_batch=30"}),
            "train.global_batch: 30 is not divisible by train.micro_batch * workers = 8 * 2 = 16");
  // The model's own rules (model::Validate) check model.config.
  EXPECT_EQ(ErrorOf(base, {"model.config.hidden_size=66"}),
            "model.config.num_attention_heads: 4 must divide hidden_size (66) when head_dim is not given");
  EXPECT_EQ(ErrorOf(base, {"model.config.num_key_value_heads=3"}),
            "model.config.num_key_value_heads: 3 must divide num_attention_heads (4)");
  EXPECT_EQ(ErrorOf(base, {"model.config.vocab_size=-5"}), "model.config.vocab_size: -5 must be positive");
  EXPECT_EQ(ErrorOf(base, {"model.config.rms_norm_eps=-1"}), "model.config.rms_norm_eps: -1 must be in (0, 1]");
  EXPECT_EQ(ErrorOf(base, {"model.config.head_dim=-2"}), "model.config.head_dim: must be >= 0, got -2");
  EXPECT_EQ(ErrorOf(base, {"model.config.sliding_window_layers=[0, 0]", "model.config.sliding_window=4"}),
            "model.config.sliding_window_layers: layer 0 listed twice");
  EXPECT_EQ(ErrorOf(base, {"model.config.num_hidden_layers=2000000000", "model.config.sliding_window_layers=[0]",
                           "model.config.sliding_window=4"}),
            "model.config.num_hidden_layers: 2000000000 must be <= 1024");
  EXPECT_EQ(ErrorOf(base, {"model.config.sliding_window_layers=[1]"}),
            "model.config.sliding_window: must be >= 1 when sliding_window_layers is set");
  EXPECT_EQ(ErrorOf(base, {"model.config.bos_token_id=200"}),
            "model.config.bos_token_id: 200 must be in [0, vocab_size=128)");
  EXPECT_EQ(ErrorOf(base, {"model.config.bos_token_id=-3"}),
            "model.config.bos_token_id: -3 must be in [0, vocab_size=128)");
  EXPECT_EQ(ErrorOf(base, {"rl.temperature=0"}), "rl.temperature: must be > 0, got 0");
  EXPECT_EQ(ErrorOf(base, {"model.from=/models/x"}), "model: set either config or from, not both");
  EXPECT_EQ(ErrorOf("kind: sft\ntask: {name: sort}\n"),
            "model: required: set model.config (inline) or model.from (HF model dir)");
  EXPECT_EQ(ErrorOf("model: {from: /m}\ntask: {name: sort}\n"), "kind: required; allowed: sft, grpo, ppo");
  EXPECT_EQ(ErrorOf(base, {"rl.prompts_per_step=3"}), "rl.prompts_per_step: 3 is not divisible by the workers = 2");
  EXPECT_EQ(ErrorOf("- 1\n- 2\n"), "document: expected a map, got a list");
  EXPECT_EQ(ErrorOf(base, {"task.name=reverse"}),
            "task.op: applies only to the arithmetic task; remove it for reverse");
  EXPECT_EQ(ErrorOf("kind: sft\nmodel: {from: /m}\ntask: {name: sort, digits: 3}\n"),
            "task.digits: applies only to the arithmetic task; use task.min_len/task.max_len for sort");
  EXPECT_EQ(ErrorOf("kind: sft\nmodel: {from: /m}\ntask: {name: sort}\n"), "OK");
  // Degraded continuation needs co-location and a peer, at any ZeRO stage.
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded=true"}), "OK");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded=true", "cluster.zero_stage=3"}), "OK");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded=true", "cluster.zero_stage=0"}), "OK");
  EXPECT_EQ(
      ErrorOf(base, {"recovery.degraded=true", "cluster.zero_stage=0", "cluster.workers=1", "rl.prompts_per_step=16"}),
      "recovery.degraded: needs cluster.workers >= 2");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded_cheap_backward=true"}),
            "recovery.degraded_cheap_backward: only with recovery.degraded: true");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded_low_rank=8"}),
            "recovery.degraded_low_rank: only with recovery.degraded: true");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded=true", "cluster.zero_stage=0", "recovery.degraded_low_rank=8"}), "OK");
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded_low_rank=-1"}).rfind("recovery.degraded_low_rank: ", 0), 0u);
  EXPECT_EQ(ErrorOf(base, {"recovery.degraded=maybe"}).rfind("recovery.degraded: expected", 0), 0u)
      << ErrorOf(base, {"recovery.degraded=maybe"});
}

TEST(JobSpecTest, MissingFileAndHfConfigKeys) {
  auto missing = LoadJobSpecFile("/nonexistent/job.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "/nonexistent/job.yaml: cannot open file");
  std::string path = ::testing::TempDir() + "/job_spec_test.yaml";
  std::ofstream(path) << "kind: sft\ntask: {name: reverse}\nmodel:\n  config:\n    model_type: llama\n"
                         "    architectures: [LlamaForCausalLM]\n    vocab_size: 128\n    hidden_size: 32\n"
                         "    intermediate_size: 64\n    num_hidden_layers: 1\n    num_attention_heads: 2\n"
                         "    rope_scaling: {type: linear, factor: 2.0}\n";
  auto spec = LoadJobSpecFile(path, {"train.steps=3"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().config().rope_scaling().rope_type(), "linear");
  EXPECT_EQ(spec->name(), "sft-job");
  std::remove(path.c_str());
}

// An inline Qwen3 / Mistral / Llama 3 config (HF names, head_dim not
// hidden/heads) reaches the worker's ModelConfig intact.
TEST(JobSpecTest, InlineModelTypesHeadDimAndLlama3Rope) {
  std::string path = ::testing::TempDir() + "/job_spec_model_types.yaml";
  auto load = [&](const std::string& model) {
    std::ofstream(path) << "kind: sft\ntask: {name: reverse}\nmodel:\n  config:\n"
                        << model
                        << "    vocab_size: 128\n    hidden_size: 48\n    intermediate_size: 64\n"
                           "    num_hidden_layers: 2\n    num_attention_heads: 4\n"
                           "    num_key_value_heads: 2\n    tokenizer: char\n";
    return LoadJobSpecFile(path, {"train.steps=3"});
  };
  auto qwen3 = load("    model_type: qwen3\n    head_dim: 16\n    tie_word_embeddings: true\n");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  auto m = model::ModelConfigFromJob(qwen3->model().config());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->model_type, "qwen3");
  EXPECT_EQ(m->HeadDim(), 16);
  EXPECT_FALSE(m->HasQkvBias());

  auto mistral = load("    model_type: mistral\n    sliding_window: 8\n");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  m = model::ModelConfigFromJob(mistral->model().config());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->LayerWindow(0), 8);
  EXPECT_EQ(m->LayerWindow(1), 8);

  auto llama3 = load(
      "    rope_scaling: {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0,\n"
      "                   high_freq_factor: 4.0, original_max_position_embeddings: 64}\n");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  m = model::ModelConfigFromJob(llama3->model().config());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->Rope().type, kernels::RopeType::kLlama3);
  EXPECT_EQ(m->Rope().high_freq_factor, 4.0);

  // The worker's checks, applied when the file is read, name the key.
  auto no_high = load(
      "    rope_scaling: {rope_type: llama3, factor: 8.0, low_freq_factor: 1.0,\n"
      "                   original_max_position_embeddings: 64}\n");
  ASSERT_FALSE(no_high.ok());
  EXPECT_NE(no_high.status().message().find("model.config.rope_scaling.high_freq_factor"), std::string::npos)
      << no_high.status();
  EXPECT_NE(ErrorOf("kind: sft\nmodel: {config: {model_type: gemma}}\n").find("model.config.model_type"),
            std::string::npos);
  auto odd = load("    head_dim: 7\n");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(std::string(odd.status().message()).find("model.config.head_dim"), std::string::npos) << odd.status();
  std::remove(path.c_str());
}

TEST(JobSpecTest, ApiSpecsGetDefaults) {
  tandem::v1::JobSpec spec;
  spec.set_kind(tandem::v1::JOB_KIND_SFT);
  spec.mutable_model()->set_from("/models/tiny");
  ApplyJobDefaults(&spec);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  EXPECT_EQ(spec.train().steps(), DefaultJobSpec().train().steps());
  EXPECT_EQ(spec.task().name(), "arithmetic");
  EXPECT_EQ(spec.rl().kl_coef(), 0);  // zero is literal over the API
  spec.mutable_train()->set_steps(-3);
  EXPECT_EQ(ValidateJobSpec(spec).message(), "train.steps: must be >= 1, got -3");
}

// Plaintext only where nobody else can connect, unless --insecure says the
// network is trusted; TLS serves anywhere.
TEST(DaemonConfigTest, PlaintextOnANetworkAddressNeedsInsecure) {
  auto config = LoadCoordinatorConfig("", {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "127.0.0.1:7070");
  for (const char* local : {"127.0.0.1:0", "127.1.2.3:7070", "localhost:7070", "[::1]:7070"}) {
    EXPECT_TRUE(LoadCoordinatorConfig("", {absl::StrCat("listen='", local, "'")}).ok()) << local;
  }
  for (const char* open : {"0.0.0.0:7070", "10.0.0.5:7070", "[::]:7070", "coord.example:7070"}) {
    auto refused = LoadCoordinatorConfig("", {absl::StrCat("listen='", open, "'")});
    ASSERT_FALSE(refused.ok()) << open;
    EXPECT_NE(refused.status().message().find("cross the network in plaintext"), std::string::npos) << refused.status();
    EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos);
    EXPECT_TRUE(LoadCoordinatorConfig("", {absl::StrCat("listen='", open, "'"), "insecure=true"}).ok()) << open;
    EXPECT_TRUE(
        LoadCoordinatorConfig("", {absl::StrCat("listen='", open, "'"), "tls.cert=c.pem", "tls.key=k.pem"}).ok());
  }
  // --insecure is a switch; "--insecure=false" still parses.
  const char* argv[] = {"tandem-coordinator", "--listen", "0.0.0.0:1", "--insecure", "--lease-ms", "3000"};
  auto args = ParseDaemonArgs(6, argv, CoordinatorFlags());
  ASSERT_TRUE(args.ok()) << args.status();
  config = LoadCoordinatorConfig(args->config_file, args->overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->insecure());
  EXPECT_EQ(config->lease_ms(), 3000);
  const char* off[] = {"tandem-coordinator", "--listen=0.0.0.0:1", "--insecure=false"};
  args = ParseDaemonArgs(3, off, CoordinatorFlags());
  ASSERT_TRUE(args.ok());
  EXPECT_FALSE(LoadCoordinatorConfig(args->config_file, args->overrides).ok());
}

// --log-file rotates by size: FILE, FILE.1 ... FILE.N, each bounded.
TEST(LoggingTest, LogFileRotatesBySize) {
  const std::string dir = ::testing::TempDir() + "/tandem_logrotate";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/c.log";
  ASSERT_TRUE(SetupLogging("test", "info", file, 8192, 2).ok());
  for (int i = 0; i < 2000; ++i) spdlog::info("line {} {}", i, std::string(40, 'x'));
  spdlog::default_logger()->flush();
  EXPECT_TRUE(std::filesystem::exists(file));
  EXPECT_TRUE(std::filesystem::exists(dir + "/c.1.log"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/c.2.log"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/c.3.log"));
  for (const auto& e : std::filesystem::directory_iterator(dir)) EXPECT_LE(e.file_size(), 8192u + 256) << e.path();
  ASSERT_TRUE(SetupLogging("test", "info").ok());
  std::filesystem::remove_all(dir);
}

TEST(AuthTest, TokenFileWarnings) {
  const std::string path = ::testing::TempDir() + "/warn.token";
  std::ofstream(path) << "secret\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(TokenFileWarnings(path).empty());
  ::chmod(path.c_str(), 0640);
  auto w = TokenFileWarnings(path);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("readable by its group (mode 0640): chmod 600"), std::string::npos) << w[0];
  ::chmod(path.c_str(), 0666);
  w = TokenFileWarnings(path);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("readable by everyone (mode 0666)"), std::string::npos) << w[0];
  EXPECT_TRUE(TokenFileWarnings("").empty());
}

TEST(DaemonConfigTest, FileFlagsAndErrors) {
  std::string path = ::testing::TempDir() + "/coordinator_test.yaml";
  std::ofstream(path) << "listen: 0.0.0.0:9000\nlease_ms: 3000\ntls: {cert: a.pem, key: b.pem}\n";  // TLS: any address
  const char* argv[] = {"tandem-coordinator", "--config", path.c_str(), "--listen=127.0.0.1:0",
                        "--lease-ms",         "4000",     "--set",      "heartbeat_ms=500"};
  auto args = ParseDaemonArgs(8, argv, CoordinatorFlags());
  ASSERT_TRUE(args.ok()) << args.status();
  auto config = LoadCoordinatorConfig(args->config_file, args->overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "127.0.0.1:0");
  EXPECT_EQ(config->lease_ms(), 4000);
  EXPECT_EQ(config->heartbeat_ms(), 500);
  EXPECT_EQ(config->tls().cert(), "a.pem");
  EXPECT_EQ(config->state_dir(), "tandem-state");
  const char* bad[] = {"x", "--bogus=1"};
  EXPECT_EQ(ParseDaemonArgs(2, bad, CoordinatorFlags()).status().message(), "unknown flag --bogus (see --help)");
  std::ofstream(path) << "lease_msx: 3000\n";
  EXPECT_EQ(std::string(LoadCoordinatorConfig(path).status().message())
                .rfind(path + ": lease_msx: unknown key; allowed: listen", 0),
            0u)
      << LoadCoordinatorConfig(path).status();
  EXPECT_EQ(LoadCoordinatorConfig("", {"heartbeat_ms=6000"}).status().message(),
            "heartbeat_ms: 6000 must be < lease_ms = 5000");
  EXPECT_EQ(LoadCoordinatorConfig("", {"tls.cert=x.pem"}).status().message(), "tls: set both cert and key, or neither");
  auto worker = LoadWorkerConfig("", {"device=cuda", "threads=4"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->device(), "cuda");
  EXPECT_EQ(LoadWorkerConfig("", {"device=tpu"}).status().message(),
            "config: device: 'tpu' is not allowed; allowed: cpu, cuda, cpu-guarded");
  EXPECT_TRUE(LoadWorkerConfig("", {"device=cpu-guarded"}).ok());
  // Graceful preemption's bound: default 25 s, 0 = stop at once, no negatives.
  EXPECT_EQ(LoadWorkerConfig("", {})->preempt_timeout_ms(), 25000);
  EXPECT_EQ(LoadWorkerConfig("", {"preempt_timeout_ms=0"})->preempt_timeout_ms(), 0);
  for (const char* bad : {"preempt_timeout_ms=-1", "preempt_timeout_ms=3600001", "preempt_timeout_ms=soon"}) {
    auto c = LoadWorkerConfig("", {bad});
    EXPECT_FALSE(c.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(c.status().message(), "preempt_timeout_ms")) << c.status();
  }
  // Strings must be UTF-8: invalid bytes would print back as U+FFFD, longer
  // than the limit (found by the daemon_config fuzz target).
  { std::ofstream(path) << "coordinator: 127.0.0.1\xff\xff:7070\nname: caf\xc3\xa9\n"; }
  EXPECT_EQ(LoadWorkerConfig(path).status().message(), path + ": coordinator: is not valid UTF-8");
  EXPECT_EQ(LoadWorkerConfig("", {"name=w\xc0\x80"}).status().message(), "config: name: is not valid UTF-8");
  EXPECT_EQ(LoadWorkerConfig("", {"name=w\xed\xa0\x80"}).status().message(), "config: name: is not valid UTF-8");
  auto accented = LoadWorkerConfig("", {"name=caf\xc3\xa9-\xf0\x9f\x98\x80"});
  ASSERT_TRUE(accented.ok()) << accented.status();
  EXPECT_EQ(accented->name(), "caf\xc3\xa9-\xf0\x9f\x98\x80");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tandem::common

namespace tandem::common {
namespace {

const char kDataJob[] = R"(
kind: grpo
model: {from: /models/m}
data: {train: t.jsonl, prompt_key: question, answer_key: answer}
reward: {type: gsm8k}
)";

TEST(JobSpecDataTest, DataAndRewardRules) {
  EXPECT_EQ(ErrorOf(kDataJob), "OK");
  auto spec = ParseJobSpecYaml(kDataJob);
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->task().name().empty());  // no built-in task default with data
  EXPECT_TRUE(spec->data().shuffle());
  EXPECT_EQ(spec->data().prompt_overflow(), "drop");
  EXPECT_EQ(ErrorOf(kDataJob, {"data.messages_key=m"}),
            "data.prompt_key: set exactly one of data.prompt_key and data.messages_key");
  EXPECT_EQ(ErrorOf(kDataJob, {"data.answer_key=''"}), "data.answer_key: required for grpo");
  EXPECT_EQ(ErrorOf(kDataJob, {"reward.type=''"}),
            "reward.type: required for grpo on data (gsm8k, math, exact, regex), or set task.reward_service");
  EXPECT_EQ(ErrorOf(kDataJob, {"reward.type=bleu"}).rfind("reward.type: 'bleu' is not allowed", 0), 0u);
  EXPECT_EQ(ErrorOf(kDataJob, {"reward.type=regex"}), "reward.pattern: required with reward.type: regex");
  EXPECT_EQ(ErrorOf(kDataJob, {"data.prompt_overflow=cut"}).rfind("data.prompt_overflow: 'cut' is not allowed", 0), 0u);
  EXPECT_EQ(ErrorOf(kDataJob, {"task.name=arithmetic"}),
            "data.train: set either data or task.name/task.data, not both");
  EXPECT_EQ(ErrorOf(kDataJob, {"model={config: {vocab_size: 99, hidden_size: 8, intermediate_size: 8, "
                               "num_hidden_layers: 1, num_attention_heads: 2}}"}),
            "data.train: needs model.from: a model directory with its tokenizer.json");
  EXPECT_EQ(ErrorOf(kDataJob, {"data.train=''"}), "data.train: required when other data keys are set");
  EXPECT_EQ(ErrorOf(kDataJob, {"rl.stop=[\"\"]"}), "rl.stop[0]: must not be empty");
  // Text data runs co-located: a disaggregated placement is refused (tandemctl
  // validate and SubmitJob share this check; tests/python covers SubmitJob).
  EXPECT_EQ(ErrorOf(kDataJob, {"cluster.workers=2",
                               "placement={mode: disaggregated, rollout_workers: 1, "
                               "train_workers: 1}"}),
            "data.train: is not supported with placement.mode: disaggregated yet");
  EXPECT_EQ(ErrorOf(kDataJob, {"data.chat=true", "data.prompt_key=''", "data.messages_key=m"}),
            "data.chat: only with data.prompt_key");
  // task.data is SFT data: a GRPO job on it is refused at submit.
  EXPECT_EQ(ErrorOf("kind: grpo\nmodel: {config: {vocab_size: 99, hidden_size: 8, intermediate_size: 8, "
                    "num_hidden_layers: 1, num_attention_heads: 2}}\ntask: {data: d.jsonl}\n")
                .rfind("task.data: is SFT data", 0),
            0u);
}

TEST(JobSpecDataTest, ShippedGsm8kConfigsValidate) {
  for (const char* name : {"grpo-gsm8k-qwen2.5-0.5b.yaml", "grpo-gsm8k-llama3.2-1b.yaml"}) {
    auto spec = LoadJobSpecFile(std::string(TANDEM_SOURCE_DIR) + "/configs/" + name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->reward().type(), "gsm8k");
    EXPECT_TRUE(spec->data().chat());
  }
}

}  // namespace
}  // namespace tandem::common
