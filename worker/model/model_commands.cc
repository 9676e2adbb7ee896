#include "worker/model/model_commands.h"

#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/config_table.h"
#include "common/job_spec.h"
#include "common/yaml_proto.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/model/context_embeddings.h"
#include "worker/model/file_util.h"
#include "worker/model/job_model.h"
#include "worker/model/model.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"
#include "worker/model/soft_prompt.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/engine.h"
#include "worker/text/text_tokenizer.h"
#include "yaml-cpp/yaml.h"

namespace tandem::model {

namespace {
using nlohmann::json;

constexpr int kUsage = 2;
constexpr int kRuntime = 1;

const char kInitHelp[] =
    "usage: tandemctl model init --config MODEL.yaml|config.json --seed S --out DIR\n"
    "  Writes a randomly initialised model to DIR: model.safetensors (sharded\n"
    "  above 5 GB), config.json, generation_config.json and tokenizer.json when\n"
    "  the config says tokenizer: char.\n"
    "  --config FILE   model config (YAML or JSON, Hugging Face config.json keys)\n"
    "  --seed S        initialisation seed (default 0)\n"
    "  --out DIR       output directory (created if missing)\n"
    "  --dtype F32|BF16  tensor type written (default F32)\n"
    "  --tokenizer DIR   copy a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json,\n"
    "                    chat template) from DIR; the config's vocab_size must hold its ids\n";

const char kGenerateHelp[] =
    "usage: tandemctl generate --model DIR (--prompt TEXT [--chat [--system TEXT]] | --prompt-ids 1,2,3)\n"
    "           [--context-embeddings FILE] [--max-new-tokens N] [--greedy | --temperature T --top-p P --top-k K]\n"
    "           [--seed S] [--num-samples N] [--threads N] [--output text|json]\n"
    "           [--sparse-top-k-blocks K [--sparse-block-size B]]\n"
    "  --prompt TEXT       encoded with the model's tokenizer (char: BOS prepended; Hugging Face:\n"
    "                      what its post-processor adds)\n"
    "  --chat              render the prompt as a user turn with the model's chat template\n"
    "  --system TEXT       with --chat: a system turn before it\n"
    "  --prompt-ids LIST   comma-separated token ids, used as given\n"
    "  --context-embeddings FILE\n"
    "                      a safetensors file with one tensor [n, hidden_size], F32 or BF16: vectors\n"
    "                      prefilled at positions 0..n-1, before the prompt (which may then be left out)\n"
    "  --max-new-tokens N  default 32\n"
    "  --greedy            argmax decoding (default when no sampling flag is given)\n"
    "  --temperature T     sampling temperature (> 0), default 1\n"
    "  --top-p P           nucleus sampling mass in (0, 1], default 1 (off)\n"
    "  --top-k K           keep the K most likely tokens, default 0 (off)\n"
    "  --seed S            sampling seed, default 0\n"
    "  --num-samples N     samples of the prompt, generated as one batch (default 1)\n"
    "  --threads N         compute threads (default: all cores)\n"
    "  --sparse-top-k-blocks K\n"
    "                      full-attention layers attend the first block, the 2 most recent blocks and\n"
    "                      the K blocks whose key summaries bound the scores highest (default: dense)\n"
    "  --sparse-block-size B  positions per sparse block, a multiple of 16 (default 64)\n"
    "  --output FORMAT     text (default) or json\n";

// --flag value / --flag=value parser against a set of known flags.
struct Flags {
  std::map<std::string, std::string> values;
  std::set<std::string> bools;
  std::string error;
};

Flags ParseFlags(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                 const std::set<std::string>& boolean) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0) {
      f.error = absl::StrCat("unexpected argument '", a, "'");
      return f;
    }
    std::string name = a, value;
    bool has_eq = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_eq = true;
    }
    if (boolean.count(name)) {
      if (has_eq) {
        f.error = absl::StrCat(name, " takes no value");
        return f;
      }
      f.bools.insert(name);
    } else if (with_value.count(name)) {
      if (!has_eq) {
        if (i + 1 >= args.size()) {
          f.error = absl::StrCat(name, " needs a value");
          return f;
        }
        value = args[++i];
      }
      f.values[name] = value;
    } else {
      f.error = absl::StrCat("unknown flag '", name, "'");
      return f;
    }
  }
  return f;
}

template <typename T>
bool ParseNumber(const std::string& s, T* out) {
  if constexpr (std::is_floating_point_v<T>) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || errno != 0) return false;
    *out = static_cast<T>(v);
    return true;
  } else {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
    return ec == std::errc() && p == s.data() + s.size();
  }
}

std::string JoinIds(const std::vector<int32_t>& ids, const char* sep) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) absl::StrAppend(&out, i ? sep : "", ids[i]);
  return out;
}
}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  if (!path.ends_with(".yaml") && !path.ends_with(".yml")) {
    auto cfg = ParseConfigJson(text);
    if (!cfg.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", cfg.status().message()));
    return cfg;
  }
  // A YAML model config is a job's model.config section, read by the job
  // file's reader and checked by the same rules.
  static const auto* options =
      new common::YamlProtoOptions(common::SectionOptions(common::JobSpecTable(), "model.config"));
  ASSIGN_OR_RETURN(YAML::Node root, common::ParseYaml(text, path, options->max_text_bytes));
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": YAML must be a mapping"));
  tandem::v1::ModelConfig proto;
  if (absl::Status st = common::YamlToProto(root, &proto, *options); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.message()));
  }
  auto cfg = ModelConfigFromJob(proto);
  if (!cfg.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", cfg.status().message()));
  return cfg;
}

int ModelInitCommand(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << kInitHelp;
      return 0;
    }
  }
  Flags f = ParseFlags(args, {"--config", "--seed", "--out", "--dtype", "--tokenizer"}, {});
  if (!f.error.empty()) {
    std::cerr << "model init: " << f.error << "\n" << kInitHelp;
    return kUsage;
  }
  if (!f.values.count("--config") || !f.values.count("--out")) {
    std::cerr << "model init: --config and --out are required\n" << kInitHelp;
    return kUsage;
  }
  uint64_t seed = 0;
  if (f.values.count("--seed") && !ParseNumber(f.values["--seed"], &seed)) {
    std::cerr << "model init: --seed must be a non-negative integer\n";
    return kUsage;
  }
  StDtype dtype = StDtype::kF32;
  if (f.values.count("--dtype")) {
    if (f.values["--dtype"] == "BF16" || f.values["--dtype"] == "bf16") dtype = StDtype::kBF16;
    else if (f.values["--dtype"] != "F32" && f.values["--dtype"] != "f32") {
      std::cerr << "model init: --dtype must be F32 or BF16\n";
      return kUsage;
    }
  }
  auto cfg = LoadModelConfigFile(f.values["--config"]);
  if (!cfg.ok()) {
    std::cerr << "model init: " << cfg.status().message() << "\n";
    return kRuntime;
  }
  std::shared_ptr<const text::Tokenizer> hf;
  if (f.values.count("--tokenizer")) {
    if (cfg->tokenizer == "char") {
      std::cerr << "model init: --tokenizer cannot be combined with tokenizer: char in the config\n";
      return kUsage;
    }
    auto t = text::LoadHfTokenizer(f.values["--tokenizer"]);
    if (!t.ok()) {
      std::cerr << "model init: --tokenizer: " << t.status().message() << "\n";
      return kRuntime;
    }
    if ((*t)->vocab_size() > cfg->vocab_size) {
      std::cerr << "model init: vocab_size " << cfg->vocab_size << " is smaller than the tokenizer's "
                << (*t)->vocab_size() << "\n";
      return kRuntime;
    }
    hf = *t;
  }
  Model model(*cfg, nullptr);
  std::vector<float> params(model.layout().total_floats());
  model.InitParams(seed, params.data());
  std::optional<CharTokenizer> tok;
  if (cfg->tokenizer == "char") tok = CharTokenizer::Default();
  SaveOptions save;
  save.dtype = dtype;
  absl::Status s = SaveModelDir(f.values["--out"], *cfg, params.data(), tok ? &*tok : nullptr, save);
  if (s.ok() && hf) s = text::CopyTokenizerFiles(f.values["--tokenizer"], f.values["--out"]);
  if (!s.ok()) {
    std::cerr << "model init: " << s.message() << "\n";
    return kRuntime;
  }
  std::cout << "wrote " << f.values["--out"] << ": " << ParameterCount(*cfg) << " parameters, "
            << cfg->num_hidden_layers << " layers, seed " << seed << (tok ? ", char tokenizer" : "")
            << (hf ? ", Hugging Face tokenizer" : "") << "\n";
  return 0;
}

int GenerateCommand(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << kGenerateHelp;
      return 0;
    }
  }
  Flags f = ParseFlags(args,
                       {"--model", "--prompt", "--prompt-ids", "--max-new-tokens", "--temperature", "--top-p",
                        "--top-k", "--seed", "--output", "--num-samples", "--threads", "--system",
                        "--context-embeddings", "--sparse-top-k-blocks", "--sparse-block-size"},
                       {"--greedy", "--chat"});
  auto usage = [](const std::string& msg) {
    std::cerr << "generate: " << msg << "\n" << kGenerateHelp;
    return kUsage;
  };
  if (!f.error.empty()) return usage(f.error);
  if (!f.values.count("--model")) return usage("--model is required");
  const bool has_context = f.values.count("--context-embeddings") > 0;
  if (f.values.count("--prompt") && f.values.count("--prompt-ids")) {
    return usage("give exactly one of --prompt and --prompt-ids");
  }
  if (!has_context && !f.values.count("--prompt") && !f.values.count("--prompt-ids")) {
    return usage("give exactly one of --prompt and --prompt-ids (or --context-embeddings)");
  }
  const bool chat = f.bools.count("--chat") > 0;
  if (chat && !f.values.count("--prompt")) return usage("--chat needs --prompt");
  if (f.values.count("--system") && !chat) return usage("--system needs --chat");
  rollout::RolloutOptions so;
  rollout::SamplingParams& sp = so.sampling;
  const bool sampling_flags = f.values.count("--temperature") || f.values.count("--top-p") || f.values.count("--top-k");
  if (f.bools.count("--greedy") && sampling_flags) {
    return usage("--greedy cannot be combined with --temperature/--top-p/--top-k");
  }
  sp.greedy = !sampling_flags;
  if (f.values.count("--max-new-tokens") &&
      (!ParseNumber(f.values["--max-new-tokens"], &so.max_new_tokens) || so.max_new_tokens < 0)) {
    return usage("--max-new-tokens must be a non-negative integer");
  }
  if (f.values.count("--temperature") &&
      (!ParseNumber(f.values["--temperature"], &sp.temperature) || !(sp.temperature > 0))) {
    return usage("--temperature must be a number > 0");
  }
  if (f.values.count("--top-p") && (!ParseNumber(f.values["--top-p"], &sp.top_p) || !(sp.top_p > 0 && sp.top_p <= 1))) {
    return usage("--top-p must be in (0, 1]");
  }
  if (f.values.count("--top-k") && (!ParseNumber(f.values["--top-k"], &sp.top_k) || sp.top_k < 0)) {
    return usage("--top-k must be a non-negative integer");
  }
  if (f.values.count("--seed") && !ParseNumber(f.values["--seed"], &sp.seed)) {
    return usage("--seed must be a non-negative integer");
  }
  int samples = 1, threads = 0;
  if (f.values.count("--num-samples") &&
      (!ParseNumber(f.values["--num-samples"], &samples) || samples < 1 || samples > 4096)) {
    return usage("--num-samples must be in [1, 4096]");
  }
  if (f.values.count("--threads") && (!ParseNumber(f.values["--threads"], &threads) || threads < 0)) {
    return usage("--threads must be a non-negative integer");
  }
  const std::string output = f.values.count("--output") ? f.values["--output"] : "text";
  if (output != "text" && output != "json") return usage("--output must be text or json");
  if (f.values.count("--sparse-block-size") && !f.values.count("--sparse-top-k-blocks")) {
    return usage("--sparse-block-size needs --sparse-top-k-blocks");
  }
  if (f.values.count("--sparse-top-k-blocks")) {
    kernels::SparseDecodeParams s;
    if (!ParseNumber(f.values["--sparse-top-k-blocks"], &s.top_k_blocks) || s.top_k_blocks < 1) {
      return usage("--sparse-top-k-blocks must be a positive integer");
    }
    if (f.values.count("--sparse-block-size") &&
        (!ParseNumber(f.values["--sparse-block-size"], &s.block_size) || s.block_size < so.block_size ||
         s.block_size % so.block_size != 0 || s.block_size > (1 << 16))) {
      return usage(absl::StrCat("--sparse-block-size must be a multiple of ", so.block_size, " up to 65536"));
    }
    so.sparse = s;
  }
  std::vector<int32_t> prompt;
  if (f.values.count("--prompt-ids")) {
    for (absl::string_view part : absl::StrSplit(f.values["--prompt-ids"], ',')) {
      int32_t id;
      if (!ParseNumber(std::string(part), &id)) {
        return usage(absl::StrCat("--prompt-ids: '", part, "' is not an integer"));
      }
      prompt.push_back(id);
    }
  }

  const auto load_start = std::chrono::steady_clock::now();
  auto loaded = LoadModelDir(f.values["--model"]);
  if (!loaded.ok()) {
    std::cerr << "generate: " << loaded.status().message() << "\n";
    return kRuntime;
  }
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ModelConfig& cfg = loaded->config;
  std::shared_ptr<const text::Tokenizer> tok;
  if (auto t = text::LoadModelTokenizer(f.values["--model"]); t.ok()) {
    tok = *t;
  } else if (t.status().code() != absl::StatusCode::kNotFound) {
    std::cerr << "generate: " << t.status().message() << "\n";
    return kRuntime;
  }
  if (f.values.count("--prompt")) {
    if (!tok) {
      std::cerr << "generate: the model has no tokenizer.json; use --prompt-ids\n";
      return kRuntime;
    }
    std::string text = f.values["--prompt"];
    const bool is_char = tok->kind() == "char";
    if (chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (f.values.count("--system")) messages.push_back({{"role", "system"}, {"content", f.values["--system"]}});
      messages.push_back({{"role", "user"}, {"content", text}});
      auto rendered = tok->ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
      if (!rendered.ok()) {
        std::cerr << "generate: --chat: " << rendered.status().message() << "\n";
        return kRuntime;
      }
      text = *rendered;
    }
    // A chat-rendered prompt already holds the special tokens it needs.
    auto ids = tok->Encode(text, /*add_special_tokens=*/!chat);
    if (!ids.ok()) {
      std::cerr << "generate: --prompt: " << ids.status().message() << "\n";
      return kUsage;
    }
    if (is_char) prompt.push_back(cfg.bos_token_id >= 0 ? cfg.bos_token_id : *tok->bos());
    prompt.insert(prompt.end(), ids->begin(), ids->end());
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= cfg.vocab_size) {
      std::cerr << "generate: prompt id " << id << " is outside the vocabulary of " << cfg.vocab_size << "\n";
      return kRuntime;
    }
  }
  // Stop at every eos the model's files name (config.json,
  // generation_config.json and the tokenizer's eos).
  for (int32_t id : cfg.eos_token_ids) so.stop_ids.push_back(id);
  if (auto gen_eos = text::GenerationConfigEosIds(f.values["--model"]); gen_eos.ok()) {
    for (int32_t id : *gen_eos) {
      if (id < cfg.vocab_size) so.stop_ids.push_back(id);
    }
  }
  if (tok && tok->eos() && *tok->eos() < cfg.vocab_size) so.stop_ids.push_back(*tok->eos());
  auto decode = [&](const std::vector<int32_t>& ids) { return tok->Decode(ids, /*skip_special_tokens=*/true); };
  std::vector<float> context;
  if (has_context) {
    auto rows = LoadContextEmbeddings(f.values["--context-embeddings"], cfg.hidden_size);
    if (!rows.ok()) {
      std::cerr << "generate: --context-embeddings: " << rows.status().message() << "\n";
      return kRuntime;
    }
    context = std::move(*rows);
  }
  if (prompt.empty() && context.empty()) return usage("the prompt is empty");
  // A model with a soft prompt (prompt tuning) runs behind it, as in training.
  const std::vector<int32_t> soft = SoftPromptIds(cfg);
  std::vector<int32_t> input = soft;
  input.insert(input.end(), prompt.begin(), prompt.end());
  auto ops = kernels::MakeCpuOps(threads);
  ParamLayout layout(cfg);  // FlatParamProvider keeps a reference
  FlatParamProvider provider(layout, loaded->params.data(), nullptr);
  rollout::RolloutEngine engine(cfg, ops.get());
  // The samples of the prompt are one group: its prefill is shared (not with
  // context embeddings, which the engine never shares).
  std::vector<rollout::RolloutRequest> requests;
  for (int i = 0; i < samples; ++i) {
    requests.push_back({input, 0, static_cast<uint64_t>(i)});
    requests.back().context = context;
  }
  auto res = engine.Generate(requests, so, provider);
  if (!res.ok()) {
    std::cerr << "generate: " << res.status().message() << "\n";
    return kRuntime;
  }
  const double secs = res->prefill_seconds + res->decode_seconds;
  const double tps = res->decode_seconds > 0 ? res->generated_tokens / res->decode_seconds : 0;
  if (output == "json") {
    json j;
    j["prompt_ids"] = prompt;
    if (!soft.empty()) j["soft_prompt_tokens"] = soft.size();
    if (has_context) j["context_rows"] = context.size() / static_cast<size_t>(cfg.hidden_size);
    json arr = json::array();
    for (const auto& g : res->sequences) {
      json s;
      s["ids"] = g.tokens;
      if (tok) s["text"] = decode(g.tokens);
      s["logprobs"] = g.logprobs;
      s["raw_logprobs"] = g.raw_logprobs;
      s["finish_reason"] = g.finish == rollout::Finish::kStop ? "stop" : "length";
      arr.push_back(s);
    }
    j["samples"] = arr;
    j["load_seconds"] = load_seconds;
    j["prefill_seconds"] = res->prefill_seconds;
    j["decode_seconds"] = res->decode_seconds;
    j["decode_tokens_per_second"] = tps;
    j["kv_cache_bytes"] = res->kv_pool_bytes;
    j["kv_peak_bytes"] = res->kv_peak_bytes;
    j["state_bytes"] = res->state_bytes;
    std::cout << j.dump() << "\n";
  } else {
    for (size_t i = 0; i < res->sequences.size(); ++i) {
      const auto& g = res->sequences[i];
      if (samples > 1) std::cout << "sample " << i << "\n";
      std::cout << "ids: " << JoinIds(g.tokens, " ") << "\n";
      if (tok) std::cout << "text: " << decode(g.tokens) << "\n";
      std::cout << "finish: " << (g.finish == rollout::Finish::kStop ? "stop" : "length") << "\n";
    }
    std::cerr << "loaded " << ParameterCount(cfg) << " parameters in " << load_seconds << " s; generated "
              << res->generated_tokens << " tokens in " << secs << " s (" << tps << " tokens/s decode), KV cache "
              << res->kv_pool_bytes << " bytes\n";
  }
  return 0;
}

}  // namespace tandem::model
