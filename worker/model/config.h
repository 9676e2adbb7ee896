// ModelConfig: the Hugging Face config.json of a LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM model (the fields
// Tandem uses), parsed, validated and written back.
//
// Parsing accepts the keys HF writes (unknown keys are ignored, as HF does;
// those that would change the math - another model_type, hidden_act other
// than silu, mlp_bias, partial_rotary_factor, unsupported rope types - are
// rejected). Defaults that differ by model type follow the HF config
// classes (Mistral: sliding_window 4096 when the key is absent; Qwen2/3:
// sliding_window 4096, max_window_layers 28). Validate() checks the values
// and names the offending key in its message. No exceptions escape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"

namespace tandem::model {

// HF `rope_scaling` (null = none).
struct RopeScaling {
  std::string rope_type = "default";  // default | linear | dynamic | yarn | llama3
  double factor = 1.0;
  int original_max_position_embeddings = 0;  // 0 = max_position_embeddings
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // 0 = HF default (yarn: 0.1 ln(factor) + 1)
  double low_freq_factor = 0.0;   // llama3 (required there)
  double high_freq_factor = 0.0;  // llama3 (required there)
};

struct ModelConfig {
  std::string model_type = "llama";  // llama | mistral | qwen2 | qwen3
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;  // 0 in JSON = absent = num_attention_heads
  int head_dim = 0;             // 0 = hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool has_rope_scaling = false;
  RopeScaling rope_scaling;
  int max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;     // q/k/v biases (Qwen2 always has them,
                                   // Mistral never)
  int bos_token_id = -1;           // -1 = none
  std::vector<int> eos_token_ids;  // HF allows an int or a list
  int pad_token_id = -1;
  // Sliding-window attention. Per layer: layer_types[i] is "full_attention"
  // or "sliding_attention" (HF >= 4.53). When layer_types is empty, Qwen's
  // use_sliding_window/max_window_layers rule applies (model_type qwen2 or
  // qwen3, or a llama config that gives use_sliding_window: layers >=
  // max_window_layers slide when use_sliding_window), else a sliding_window
  // alone applies to all layers (Mistral); sliding_window <= 0 = none.
  // Window semantics as HF's masking_utils: key j visible from query i when
  // i - window < j <= i.
  int sliding_window = 0;
  std::vector<std::string> layer_types;
  bool use_sliding_window = false;      // Qwen2
  int max_window_layers = 0;            // Qwen2
  bool sliding_window_set = false;      // key present (and non-null) in the input
  bool use_sliding_window_set = false;  // key present in the input
  // Tandem extension: per-layer attention types (layer_types.h).
  std::vector<std::string> tandem_layer_types;
  // Tandem extension: a soft prompt of this many trainable embedding rows
  // (tensor tandem.soft_prompt [n, hidden_size], stored right after the
  // token embeddings). Token id vocab_size + i reads row i, so a sequence
  // that starts with ids vocab_size .. vocab_size + n - 1 runs behind the
  // soft prompt (soft_prompt.h); the LM head still scores vocab_size ids.
  int tandem_soft_prompt_tokens = 0;
  std::string torch_dtype = "float32";
  std::string tokenizer;  // "char" = built-in CharTokenizer; "" = none

  // Derived.
  int HeadDim() const {
    return head_dim > 0 ? head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0);
  }
  int KvHeads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  bool HasQkvBias() const { return model_type == "qwen2" || (model_type != "mistral" && attention_bias); }
  // Qwen3: RMSNorm over each query and key head (weights [head_dim]) after
  // the projections (and biases), before RoPE.
  bool HasQkNorm() const { return model_type == "qwen3"; }
  // Qwen's sliding-window rule (use_sliding_window, max_window_layers).
  bool QwenFamily() const { return model_type == "qwen2" || model_type == "qwen3"; }
  // Attention window of layer i for kernels::AttentionParams::window
  // (-1 = full attention).
  int LayerWindow(int layer) const;
  // Rotary configuration for the kernels (assumes Validate() passed).
  kernels::RopeConfig Rope() const;
  // First EOS id or -1.
  int Eos() const { return eos_token_ids.empty() ? -1 : eos_token_ids[0]; }
};

// Parses config.json text; then Validate()s. Errors name the key.
absl::StatusOr<ModelConfig> ParseConfigJson(std::string_view text);
// Writes an HF-compatible config.json (architectures, model_type, ...).
std::string ToConfigJson(const ModelConfig& config);
// Range and consistency checks (heads divide hidden, kv heads divide heads,
// positive sizes, upper bounds, known rope type, layer_types length...).
absl::Status Validate(const ModelConfig& config);
// Total parameter count (floats) of the model, no padding.
int64_t ParameterCount(const ModelConfig& config);

// Rows of rotary tables to build for `positions` positions: the next power
// of two (at least 256), so tables grow by doubling as sequences get longer.
inline int RopeRowsFor(int positions) {
  int rows = 256;
  while (rows < positions && rows < (1 << 30)) rows *= 2;
  return rows;
}

}  // namespace tandem::model
