#include "worker/model/job_model.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "worker/model/file_util.h"
#include "worker/model/layer_types.h"
#include "worker/model/param_layout.h"
#include "worker/model/trainable.h"

namespace tandem::model {

namespace {

// model::Validate's "config key 'K' = V: why" as the job file's
// "model.config.K: V why".
absl::Status JobKeyError(const absl::Status& st) {
  const absl::string_view msg = st.message();
  constexpr absl::string_view kPrefix = "config key '";
  if (msg.substr(0, kPrefix.size()) != kPrefix || msg.find('\'', kPrefix.size()) == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("model.config: ", msg));
  }
  const size_t end = msg.find('\'', kPrefix.size());
  const absl::string_view key = msg.substr(kPrefix.size(), end - kPrefix.size());
  std::string rest(msg.substr(end + 1));
  if (rest.rfind(" = ", 0) == 0) {
    rest = rest.substr(3);
    if (auto colon = rest.find(": "); colon != std::string::npos) rest.replace(colon, 2, " ");
  } else if (!rest.empty() && rest[0] == ' ') {
    rest = rest.substr(1);
  }
  return absl::InvalidArgumentError(absl::StrCat("model.config.", key, ": ", rest));
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromJob(const tandem::v1::ModelConfig& c) {
  // What a proto can hold but a config.json cannot say.
  if (c.head_dim() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("model.config.head_dim: must be >= 0, got ", c.head_dim()));
  }
  if (c.sliding_window() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.config.sliding_window: must be >= 0, got ", c.sliding_window()));
  }
  if (c.sliding_window_layers_size() > 0 && c.sliding_window() == 0) {
    return absl::InvalidArgumentError("model.config.sliding_window: must be >= 1 when sliding_window_layers is set");
  }
  ModelConfig m;
  m.model_type = !c.model_type().empty() ? c.model_type() : c.attention_bias() ? "qwen2" : "llama";
  m.head_dim = c.head_dim();
  m.vocab_size = c.vocab_size();
  m.hidden_size = c.hidden_size();
  m.intermediate_size = c.intermediate_size();
  m.num_hidden_layers = c.num_hidden_layers();
  m.num_attention_heads = c.num_attention_heads();
  m.num_key_value_heads = c.num_key_value_heads();
  if (c.rms_norm_eps() != 0) m.rms_norm_eps = c.rms_norm_eps();
  if (c.rope_theta() != 0) m.rope_theta = c.rope_theta();
  if (c.has_rope_scaling() && !c.rope_scaling().rope_type().empty() && c.rope_scaling().rope_type() != "default") {
    m.has_rope_scaling = true;
    const auto& r = c.rope_scaling();
    m.rope_scaling.rope_type = r.rope_type();
    if (r.factor() != 0) m.rope_scaling.factor = r.factor();
    m.rope_scaling.original_max_position_embeddings = r.original_max_position_embeddings();
    if (r.beta_fast() > 0) m.rope_scaling.beta_fast = r.beta_fast();
    if (r.beta_slow() > 0) m.rope_scaling.beta_slow = r.beta_slow();
    m.rope_scaling.attention_factor = r.attention_factor();
    m.rope_scaling.low_freq_factor = r.low_freq_factor();
    m.rope_scaling.high_freq_factor = r.high_freq_factor();
  }
  if (c.max_position_embeddings() != 0) m.max_position_embeddings = c.max_position_embeddings();
  m.tie_word_embeddings = c.tie_word_embeddings();
  m.attention_bias = c.attention_bias();
  if (m.model_type == "mistral" && c.sliding_window() > 0 && c.sliding_window_layers_size() == 0) {
    // Mistral: the window applies to every layer.
    m.sliding_window = c.sliding_window();
    m.sliding_window_set = true;
  }
  m.tandem_layer_types.assign(c.tandem_layer_types().begin(), c.tandem_layer_types().end());
  m.tokenizer = c.tokenizer();
  if (m.tokenizer == "char") {
    // The built-in char tokenizer's special ids (worker/model/tokenizer.h).
    m.bos_token_id = 1;
    m.eos_token_ids = {2};
    m.pad_token_id = 0;
  }
  // 0 = unset (proto3); a negative id reaches Validate, which refuses it.
  if (c.bos_token_id() != 0) m.bos_token_id = c.bos_token_id();
  if (c.eos_token_id() != 0) m.eos_token_ids = {c.eos_token_id()};
  if (c.pad_token_id() != 0) m.pad_token_id = c.pad_token_id();
  // The sizes first: num_hidden_layers bounds the per-layer list below.
  if (absl::Status st = Validate(m); !st.ok()) return JobKeyError(st);
  if (c.sliding_window_layers_size() == 0) return m;
  m.sliding_window = c.sliding_window();
  m.sliding_window_set = true;
  m.layer_types.assign(m.num_hidden_layers, "full_attention");
  for (int layer : c.sliding_window_layers()) {
    if (layer < 0 || layer >= m.num_hidden_layers) {
      return absl::InvalidArgumentError("model.config.sliding_window_layers: layer " + std::to_string(layer) +
                                        " out of range [0, num_hidden_layers)");
    }
    if (m.layer_types[layer] == "sliding_attention") {
      return absl::InvalidArgumentError(
          absl::StrCat("model.config.sliding_window_layers: layer ", layer, " listed twice"));
    }
    m.layer_types[layer] = "sliding_attention";
  }
  if (absl::Status st = Validate(m); !st.ok()) return JobKeyError(st);
  return m;
}

absl::Status CheckJobForWorkers(const tandem::v1::JobSpec& spec) {
  if (spec.model().has_config()) {
    auto config = ModelConfigFromJob(spec.model().config());
    if (!config.ok()) return config.status();
  }
  return absl::OkStatus();
}

namespace {

// Saturating arithmetic on non-negative byte counts.
int64_t Mul(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors) {
    if (f <= 0) return 0;
    if (__builtin_mul_overflow(out, f, &out)) return INT64_MAX;
  }
  return out;
}
int64_t Add(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_add_overflow(a, b, &out) ? INT64_MAX : out;
}
std::string GiB(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= (1 << 30)) return absl::StrFormat("%.1f GiB", b / (1 << 30));
  if (b >= (1 << 20)) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  return absl::StrFormat("%.1f KiB", b / 1024);
}

}  // namespace

std::string MemoryEstimate::Describe() const {
  std::vector<std::string> parts;
  auto part = [&](const char* name, int64_t bytes) {
    if (bytes > 0) parts.push_back(absl::StrCat(name, " ", GiB(bytes)));
  };
  part("params", params);
  part("gradients", gradients);
  part("optimizer", optimizer);
  part("reference", reference);
  part("activations", activations);
  part("logits", logits);
  part("kv cache", kv_cache);
  part("rope", rope);
  return absl::StrCat(GiB(total), " (", absl::StrJoin(parts, ", "), ")");
}

MemoryEstimate EstimateJobMemory(const tandem::v1::JobSpec& spec, const ModelConfig& c) {
  MemoryEstimate m;
  const int64_t p = ParameterCount(c);
  const int64_t world = std::max(1, spec.cluster().workers());
  const int stage = spec.cluster().zero_stage();
  const int64_t layers = std::max(1, c.num_hidden_layers);
  const bool bf16 = spec.train().precision() == "bf16";
  // ZeRO: stage >= 1 shards the optimizer, >= 2 the gradients, 3 the
  // parameters (plus one layer gathered at a time).
  m.params = stage >= 3 ? Add(Mul({4, p}) / world, Mul({4, p}) / layers) : Mul({4, p});
  if (bf16) m.params = Add(m.params, stage >= 3 ? Mul({2, p}) / layers : Mul({2, p}));
  // train.trainable: gradients and moments of the trainable tensors only.
  int64_t t = p;
  if (spec.train().trainable_size() > 0) {
    auto count = TrainableCount(ParamLayout(c), {spec.train().trainable().begin(), spec.train().trainable().end()});
    if (count.ok()) t = static_cast<int64_t>(*count);
  }
  m.gradients = stage >= 2 ? Mul({4, t}) / world : Mul({4, t});
  m.optimizer = stage >= 1 ? Mul({8, t}) / world : Mul({8, t});
  const bool rl = spec.kind() == tandem::v1::JOB_KIND_GRPO || spec.kind() == tandem::v1::JOB_KIND_PPO;
  if (rl && spec.rl().kl_coef() > 0) m.reference = Mul({4, p});
  const int64_t batch = std::max(1, spec.train().micro_batch());
  const int64_t seq = std::max(1, spec.train().seq_len()) + (rl ? std::max(0, spec.rl().max_new_tokens()) : 0);
  const int64_t h = c.hidden_size, inter = c.intermediate_size, heads = c.num_attention_heads;
  // Per token and layer: the inputs of every matmul and norm kept for
  // backward (about 12 hidden-sized and 3 intermediate-sized vectors), plus
  // the attention probabilities of one layer at a time.
  m.activations =
      Add(Mul({4, batch, seq, layers, Add(Mul({12, h}), Mul({3, inter}))}), Mul({4, batch, heads, seq, seq}));
  m.logits = Mul({2 * 4, batch, seq, c.vocab_size});
  if (rl) {
    const int64_t sequences =
        (Mul({std::max(1, spec.rl().prompts_per_step()), std::max(1, spec.rl().group_size())}) + world - 1) / world;
    // Linear-attention layers hold a [heads, head_dim, head_dim] state per
    // sequence instead of KV; window and sink layers at most their keys and
    // one step's rows (the rollout engine gives the rest back).
    const int64_t step_rows = spec.rollout().max_batch_tokens() > 0 ? spec.rollout().max_batch_tokens() : 2048;
    int64_t linear = 0, kv_positions = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const LayerType t = LayerTypeOf(c, l);
      if (t.kind == LayerKind::kLinear) {
        ++linear;
      } else {
        const int bounded = t.BoundedKeys();
        kv_positions = Add(kv_positions, bounded > 0 ? std::min<int64_t>(seq, bounded + step_rows) : seq);
      }
    }
    m.kv_cache = Add(Mul({4 * 2, sequences, kv_positions, c.KvHeads(), c.HeadDim()}),
                     Mul({4, sequences, linear, heads, c.HeadDim(), c.HeadDim()}));
  }
  m.rope = Mul({4 * 2, RopeRowsFor(static_cast<int>(std::min<int64_t>(seq, 1 << 30))), c.HeadDim() / 2});
  for (int64_t part : {m.params, m.gradients, m.optimizer, m.reference, m.activations, m.logits, m.kv_cache, m.rope}) {
    m.total = Add(m.total, part);
  }
  return m;
}

absl::StatusOr<ModelConfig> JobModelConfig(const tandem::v1::JobSpec& spec) {
  if (spec.model().has_config()) return ModelConfigFromJob(spec.model().config());
  if (spec.model().from().empty()) return absl::NotFoundError("no model");
  auto text = ReadFileToString(spec.model().from() + "/config.json");
  if (!text.ok()) return absl::NotFoundError(text.status().message());
  return ParseConfigJson(*text);
}

}  // namespace tandem::model
