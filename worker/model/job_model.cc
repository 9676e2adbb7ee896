#include "worker/model/job_model.h"

#include <string>

namespace tandem::model {

absl::StatusOr<ModelConfig> ModelConfigFromJob(const tandem::v1::ModelConfig& c) {
  ModelConfig m;
  m.model_type = !c.model_type().empty() ? c.model_type()
                 : c.attention_bias()      ? "qwen2"
                                           : "llama";
  m.head_dim = c.head_dim();
  m.vocab_size = c.vocab_size();
  m.hidden_size = c.hidden_size();
  m.intermediate_size = c.intermediate_size();
  m.num_hidden_layers = c.num_hidden_layers();
  m.num_attention_heads = c.num_attention_heads();
  m.num_key_value_heads = c.num_key_value_heads();
  if (c.rms_norm_eps() > 0) m.rms_norm_eps = c.rms_norm_eps();
  if (c.rope_theta() > 0) m.rope_theta = c.rope_theta();
  if (c.has_rope_scaling() && !c.rope_scaling().rope_type().empty() &&
      c.rope_scaling().rope_type() != "default") {
    m.has_rope_scaling = true;
    const auto& r = c.rope_scaling();
    m.rope_scaling.rope_type = r.rope_type();
    if (r.factor() > 0) m.rope_scaling.factor = r.factor();
    m.rope_scaling.original_max_position_embeddings =
        r.original_max_position_embeddings();
    if (r.beta_fast() > 0) m.rope_scaling.beta_fast = r.beta_fast();
    if (r.beta_slow() > 0) m.rope_scaling.beta_slow = r.beta_slow();
    m.rope_scaling.attention_factor = r.attention_factor();
    m.rope_scaling.low_freq_factor = r.low_freq_factor();
    m.rope_scaling.high_freq_factor = r.high_freq_factor();
  }
  if (c.max_position_embeddings() > 0)
    m.max_position_embeddings = c.max_position_embeddings();
  m.tie_word_embeddings = c.tie_word_embeddings();
  m.attention_bias = c.attention_bias();
  if (m.model_type == "mistral" && c.sliding_window() > 0 &&
      c.sliding_window_layers_size() == 0) {
    // Mistral: the window applies to every layer.
    m.sliding_window = c.sliding_window();
    m.sliding_window_set = true;
  }
  if (c.sliding_window() > 0 && c.sliding_window_layers_size() > 0) {
    m.sliding_window = c.sliding_window();
    m.sliding_window_set = true;
    m.layer_types.assign(m.num_hidden_layers > 0 ? m.num_hidden_layers : 0,
                         "full_attention");
    for (int layer : c.sliding_window_layers()) {
      if (layer < 0 || layer >= m.num_hidden_layers) {
        return absl::InvalidArgumentError(
            "model.config.sliding_window_layers: layer " +
            std::to_string(layer) + " out of range [0, num_hidden_layers)");
      }
      m.layer_types[layer] = "sliding_attention";
    }
  }
  m.tokenizer = c.tokenizer();
  if (m.tokenizer == "char") {
    // The built-in char tokenizer's special ids (worker/model/tokenizer.h).
    m.bos_token_id = 1;
    m.eos_token_ids = {2};
    m.pad_token_id = 0;
  }
  if (c.bos_token_id() > 0) m.bos_token_id = c.bos_token_id();
  if (c.eos_token_id() > 0) m.eos_token_ids = {c.eos_token_id()};
  if (c.pad_token_id() > 0) m.pad_token_id = c.pad_token_id();
  absl::Status st = Validate(m);
  if (!st.ok()) {
    return absl::InvalidArgumentError("model.config: " + std::string(st.message()));
  }
  return m;
}

absl::Status CheckJobForWorkers(const tandem::v1::JobSpec& spec) {
  if (spec.model().has_config()) {
    auto config = ModelConfigFromJob(spec.model().config());
    if (!config.ok()) return config.status();
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
