#include "worker/model/config.h"

#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/layer_types.h"
#include "worker/model/strict_json.h"

namespace tandem::model {

namespace {

using nlohmann::json;

// An integral JSON number that fits an int (2.0 counts; 1e10 does not).
absl::Status ToInt(const json& v, const char* key, int* out) {
  if (v.is_number_unsigned() || v.is_number_integer()) {
    const bool fits =
        v.is_number_unsigned() ? std::in_range<int>(v.get<uint64_t>()) : std::in_range<int>(v.get<int64_t>());
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' = ", v.dump(), " is out of range"));
    }
    *out = v.get<int>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 2e9) {
    *out = static_cast<int>(v.get<double>());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' must be an integer, got ", v.dump()));
  }
  return absl::OkStatus();
}

// Typed readers: a missing or null key leaves *out unchanged; a key of the
// wrong type is an error naming it.
absl::Status GetInt(const json& j, const char* key, int* out, bool* present = nullptr) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  RETURN_IF_ERROR(ToInt(*it, key, out));
  if (present != nullptr) *present = true;
  return absl::OkStatus();
}

absl::Status GetDouble(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' must be a number, got ", it->dump()));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const char* key, bool* out, bool* present = nullptr) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' must be true or false, got ", it->dump()));
  }
  *out = it->get<bool>();
  if (present != nullptr) *present = true;
  return absl::OkStatus();
}

absl::Status GetString(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' must be a string, got ", it->dump()));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const json& rs, RopeScaling* out) {
  if (!rs.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key 'rope_scaling' must be an object or null, got ", rs.dump()));
  }
  std::string type;
  RETURN_IF_ERROR(GetString(rs, "rope_type", &type));
  if (type.empty()) RETURN_IF_ERROR(GetString(rs, "type", &type));
  if (type.empty()) {
    return absl::InvalidArgumentError("config key 'rope_scaling' needs 'rope_type' (or 'type')");
  }
  out->rope_type = type;
  RETURN_IF_ERROR(GetDouble(rs, "factor", &out->factor));
  RETURN_IF_ERROR(GetInt(rs, "original_max_position_embeddings", &out->original_max_position_embeddings));
  RETURN_IF_ERROR(GetDouble(rs, "beta_fast", &out->beta_fast));
  RETURN_IF_ERROR(GetDouble(rs, "beta_slow", &out->beta_slow));
  RETURN_IF_ERROR(GetDouble(rs, "attention_factor", &out->attention_factor));
  RETURN_IF_ERROR(GetDouble(rs, "low_freq_factor", &out->low_freq_factor));
  RETURN_IF_ERROR(GetDouble(rs, "high_freq_factor", &out->high_freq_factor));
  if (type == "llama3") {
    // transformers reads these four keys unconditionally.
    for (const char* k : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (!rs.contains(k) || rs[k].is_null()) {
        return absl::InvalidArgumentError(
            absl::StrCat("config key 'rope_scaling.", k, "' is required with rope_type llama3"));
      }
    }
  }
  for (const char* k : {"low_freq_factor", "high_freq_factor"}) {
    if (rs.contains(k) && !rs[k].is_null() && type != "llama3") {
      return absl::InvalidArgumentError(
          absl::StrCat("config key 'rope_scaling.", k, "' is only used with rope_type llama3, not '", type, "'"));
    }
  }
  for (const char* k : {"mscale", "mscale_all_dim", "short_factor", "long_factor"}) {
    if (rs.contains(k) && !rs[k].is_null()) {
      return absl::InvalidArgumentError(absl::StrCat("config key 'rope_scaling.", k, "' is not supported by Tandem"));
    }
  }
  return absl::OkStatus();
}

// Tandem extension keys (layer_types.h); validated in ValidateLayerTypes.
absl::Status ParseTandemLayerTypes(const json& j, ModelConfig* c) {
  const std::string key(kLayerTypesKey);
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  auto bad = absl::InvalidArgumentError(absl::StrCat("config key '", key, "' must be a list of strings"));
  if (!it->is_array()) return bad;
  for (const auto& e : *it) {
    if (!e.is_string()) return bad;
    c->tandem_layer_types.push_back(e.get<std::string>());
  }
  return absl::OkStatus();
}

// Tandem extension key tandem_soft_prompt_tokens; range checked in Validate.
absl::Status ParseSoftPromptTokens(const json& j, ModelConfig* c) {
  auto it = j.find("tandem_soft_prompt_tokens");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
    return absl::InvalidArgumentError("config key 'tandem_soft_prompt_tokens' must be a non-negative integer");
  }
  c->tandem_soft_prompt_tokens = static_cast<int>(it->get<int64_t>());
  return absl::OkStatus();
}

}  // namespace

int ModelConfig::LayerWindow(int layer) const {
  if (!layer_types.empty()) {
    return layer_types[layer] == "sliding_attention" && sliding_window > 0 ? sliding_window : -1;
  }
  if (sliding_window <= 0) return -1;
  if (QwenFamily() || (model_type == "llama" && use_sliding_window_set)) {
    return use_sliding_window && layer >= max_window_layers ? sliding_window : -1;
  }
  return sliding_window;
}

kernels::RopeConfig ModelConfig::Rope() const {
  kernels::RopeConfig r;
  r.head_dim = HeadDim();
  r.theta = rope_theta;
  r.original_max_position = max_position_embeddings;
  if (has_rope_scaling) {
    const std::string& t = rope_scaling.rope_type;
    if (t == "linear") r.type = kernels::RopeType::kLinear;
    if (t == "dynamic") r.type = kernels::RopeType::kDynamicNtk;
    if (t == "yarn") r.type = kernels::RopeType::kYarn;
    if (t == "llama3") r.type = kernels::RopeType::kLlama3;
    r.factor = rope_scaling.factor;
    if (rope_scaling.original_max_position_embeddings > 0) {
      r.original_max_position = rope_scaling.original_max_position_embeddings;
    }
    r.beta_fast = rope_scaling.beta_fast;
    r.beta_slow = rope_scaling.beta_slow;
    r.attention_factor = rope_scaling.attention_factor;
    r.low_freq_factor = rope_scaling.low_freq_factor;
    r.high_freq_factor = rope_scaling.high_freq_factor;
  }
  return r;
}

absl::StatusOr<ModelConfig> ParseConfigJson(std::string_view text) {
  ASSIGN_OR_RETURN(const json j, ParseStrictJson(text, "config.json"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError("config.json must be a JSON object");
  }
  ModelConfig c;
  RETURN_IF_ERROR(GetString(j, "model_type", &c.model_type));
  RETURN_IF_ERROR(GetInt(j, "vocab_size", &c.vocab_size));
  RETURN_IF_ERROR(GetInt(j, "hidden_size", &c.hidden_size));
  RETURN_IF_ERROR(GetInt(j, "intermediate_size", &c.intermediate_size));
  RETURN_IF_ERROR(GetInt(j, "num_hidden_layers", &c.num_hidden_layers));
  RETURN_IF_ERROR(GetInt(j, "num_attention_heads", &c.num_attention_heads));
  bool kv_present = false;
  RETURN_IF_ERROR(GetInt(j, "num_key_value_heads", &c.num_key_value_heads, &kv_present));
  if (kv_present && c.num_key_value_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config key 'num_key_value_heads' must be positive, got ", c.num_key_value_heads));
  }
  bool hd_present = false;
  RETURN_IF_ERROR(GetInt(j, "head_dim", &c.head_dim, &hd_present));
  if (hd_present && c.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("config key 'head_dim' must be positive, got ", c.head_dim));
  }
  RETURN_IF_ERROR(GetDouble(j, "rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(GetDouble(j, "rope_theta", &c.rope_theta));
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    c.has_rope_scaling = true;
    RETURN_IF_ERROR(ParseRopeScaling(*it, &c.rope_scaling));
  }
  RETURN_IF_ERROR(GetInt(j, "max_position_embeddings", &c.max_position_embeddings));
  RETURN_IF_ERROR(GetBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(GetBool(j, "attention_bias", &c.attention_bias));
  RETURN_IF_ERROR(GetInt(j, "bos_token_id", &c.bos_token_id));
  RETURN_IF_ERROR(GetInt(j, "pad_token_id", &c.pad_token_id));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_array()) {
      for (const auto& e : *it) {
        int eos = -1;
        RETURN_IF_ERROR(ToInt(e, "eos_token_id", &eos));
        c.eos_token_ids.push_back(eos);
      }
    } else {
      int eos = -1;
      RETURN_IF_ERROR(GetInt(j, "eos_token_id", &eos));
      c.eos_token_ids.push_back(eos);
    }
  }
  // HF config classes' defaults where the key is absent (not null).
  if (!j.contains("sliding_window") &&
      (c.model_type == "mistral" || c.model_type == "qwen2" || c.model_type == "qwen3")) {
    c.sliding_window = 4096;
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3") c.max_window_layers = 28;
  RETURN_IF_ERROR(GetInt(j, "sliding_window", &c.sliding_window, &c.sliding_window_set));
  if (auto it = j.find("sliding_window"); it != j.end() && it->is_null()) c.sliding_window = 0;
  RETURN_IF_ERROR(GetBool(j, "use_sliding_window", &c.use_sliding_window, &c.use_sliding_window_set));
  RETURN_IF_ERROR(GetInt(j, "max_window_layers", &c.max_window_layers));
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError("config key 'layer_types' must be a list of strings");
    }
    for (const auto& e : *it) {
      if (!e.is_string()) {
        return absl::InvalidArgumentError("config key 'layer_types' must be a list of strings");
      }
      c.layer_types.push_back(e.get<std::string>());
    }
  }
  RETURN_IF_ERROR(ParseTandemLayerTypes(j, &c));
  RETURN_IF_ERROR(ParseSoftPromptTokens(j, &c));
  RETURN_IF_ERROR(GetString(j, "torch_dtype", &c.torch_dtype));
  RETURN_IF_ERROR(GetString(j, "tokenizer", &c.tokenizer));
  std::string act = "silu";
  RETURN_IF_ERROR(GetString(j, "hidden_act", &act));
  if (act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat("config key 'hidden_act' = '", act, "' is not supported (only silu)"));
  }
  bool mlp_bias = false;
  RETURN_IF_ERROR(GetBool(j, "mlp_bias", &mlp_bias));
  if (mlp_bias) {
    return absl::InvalidArgumentError("config key 'mlp_bias' = true is not supported");
  }
  if (j.contains("rope_parameters")) {
    // Newer transformers versions move rope_theta and the scaling here.
    return absl::InvalidArgumentError(
        "config key 'rope_parameters' is not supported: give rope_theta and "
        "rope_scaling instead");
  }
  double partial_rotary_factor = 1.0;
  RETURN_IF_ERROR(GetDouble(j, "partial_rotary_factor", &partial_rotary_factor));
  if (partial_rotary_factor != 1.0) {
    return absl::InvalidArgumentError(absl::StrCat("config key 'partial_rotary_factor' = ", partial_rotary_factor,
                                                   " is not supported (rotary embedding over the whole head only)"));
  }
  RETURN_IF_ERROR(Validate(c));
  return c;
}

absl::Status Validate(const ModelConfig& c) {
  auto bad = [](absl::string_view key, auto value, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' = ", value, ": ", why));
  };
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2" && c.model_type != "qwen3") {
    return absl::InvalidArgumentError(
        absl::StrCat("config key 'model_type' = '", c.model_type, "' is not supported (llama, mistral, qwen2, qwen3)"));
  }
  if (c.vocab_size <= 0) return bad("vocab_size", c.vocab_size, "must be positive");
  if (c.vocab_size > 4'000'000) return bad("vocab_size", c.vocab_size, "must be <= 4000000");
  if (c.hidden_size <= 0) return bad("hidden_size", c.hidden_size, "must be positive");
  if (c.hidden_size > 65536) return bad("hidden_size", c.hidden_size, "must be <= 65536");
  if (c.intermediate_size <= 0) return bad("intermediate_size", c.intermediate_size, "must be positive");
  if (c.intermediate_size > 262144) return bad("intermediate_size", c.intermediate_size, "must be <= 262144");
  if (c.num_hidden_layers <= 0) return bad("num_hidden_layers", c.num_hidden_layers, "must be positive");
  if (c.num_hidden_layers > 1024) return bad("num_hidden_layers", c.num_hidden_layers, "must be <= 1024");
  if (c.num_attention_heads <= 0) return bad("num_attention_heads", c.num_attention_heads, "must be positive");
  if (c.num_attention_heads > 1024) return bad("num_attention_heads", c.num_attention_heads, "must be <= 1024");
  if (c.head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
    return bad("num_attention_heads", c.num_attention_heads,
               absl::StrCat("must divide hidden_size (", c.hidden_size, ") when head_dim is not given"));
  }
  if (c.num_key_value_heads < 0) return bad("num_key_value_heads", c.num_key_value_heads, "must be positive");
  if (c.num_attention_heads % c.KvHeads() != 0) {
    return bad("num_key_value_heads", c.KvHeads(),
               absl::StrCat("must divide num_attention_heads (", c.num_attention_heads, ")"));
  }
  const int d = c.HeadDim();
  if (d <= 0 || d % 2 != 0) return bad("head_dim", d, "must be positive and even (rotary embedding)");
  if (d > 1024) return bad("head_dim", d, "must be <= 1024");
  if (!(c.rms_norm_eps > 0) || c.rms_norm_eps > 1) return bad("rms_norm_eps", c.rms_norm_eps, "must be in (0, 1]");
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) return bad("rope_theta", c.rope_theta, "must be > 1");
  if (c.max_position_embeddings <= 0)
    return bad("max_position_embeddings", c.max_position_embeddings, "must be positive");
  if (c.max_position_embeddings > (1 << 24))
    return bad("max_position_embeddings", c.max_position_embeddings, "must be <= 16777216");
  if (c.has_rope_scaling) {
    const std::string& t = c.rope_scaling.rope_type;
    if (t != "default" && t != "linear" && t != "dynamic" && t != "yarn" && t != "llama3") {
      return absl::InvalidArgumentError(absl::StrCat("config key 'rope_scaling.rope_type' = '", t,
                                                     "' is not supported (default, linear, dynamic, yarn, llama3)"));
    }
    if (t != "default" && !(c.rope_scaling.factor >= 1.0 && c.rope_scaling.factor <= 1024)) {
      return bad("rope_scaling.factor", c.rope_scaling.factor, "must be in [1, 1024]");
    }
    if (c.rope_scaling.original_max_position_embeddings < 0) {
      return bad("rope_scaling.original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings,
                 "must be positive");
    }
    if (c.rope_scaling.attention_factor < 0) {
      return bad("rope_scaling.attention_factor", c.rope_scaling.attention_factor, "must be >= 0");
    }
    if (t == "llama3") {
      const RopeScaling& rs = c.rope_scaling;
      if (rs.original_max_position_embeddings <= 0) {
        return bad("rope_scaling.original_max_position_embeddings", rs.original_max_position_embeddings,
                   "must be positive with rope_type llama3");
      }
      if (!(rs.low_freq_factor > 0) || !std::isfinite(rs.low_freq_factor)) {
        return bad("rope_scaling.low_freq_factor", rs.low_freq_factor, "must be > 0");
      }
      if (!(rs.high_freq_factor > rs.low_freq_factor) || !std::isfinite(rs.high_freq_factor)) {
        return bad("rope_scaling.high_freq_factor", rs.high_freq_factor,
                   absl::StrCat("must be > low_freq_factor (", rs.low_freq_factor, ")"));
      }
    }
  }
  if (c.sliding_window < 0) return bad("sliding_window", c.sliding_window, "must be >= 0 (0 or null = none)");
  if (!c.layer_types.empty()) {
    if (static_cast<int>(c.layer_types.size()) != c.num_hidden_layers) {
      return bad("layer_types", c.layer_types.size(),
                 absl::StrCat("entries; must have num_hidden_layers (", c.num_hidden_layers, ") entries"));
    }
    bool any_sliding = false;
    for (const std::string& t : c.layer_types) {
      if (t != "full_attention" && t != "sliding_attention") {
        return absl::InvalidArgumentError(
            absl::StrCat("config key 'layer_types' has '", t, "'; expected full_attention or sliding_attention"));
      }
      any_sliding |= t == "sliding_attention";
    }
    if (any_sliding && c.sliding_window <= 0) {
      return absl::InvalidArgumentError(
          "config key 'sliding_window' must be positive when layer_types "
          "has sliding_attention layers");
    }
  }
  if (c.max_window_layers < 0) return bad("max_window_layers", c.max_window_layers, "must be >= 0");
  RETURN_IF_ERROR(ValidateLayerTypes(c));
  // The prompt leaves room for at least one token in the context.
  if (c.tandem_soft_prompt_tokens < 0 || c.tandem_soft_prompt_tokens >= c.max_position_embeddings) {
    return bad("tandem_soft_prompt_tokens", c.tandem_soft_prompt_tokens,
               absl::StrCat("must be in [0, max_position_embeddings=", c.max_position_embeddings, ")"));
  }
  auto check_id = [&](absl::string_view key, int id) -> absl::Status {
    if (id < -1 || id >= c.vocab_size) {
      return bad(key, id, absl::StrCat("must be in [0, vocab_size=", c.vocab_size, ")"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check_id("bos_token_id", c.bos_token_id));
  RETURN_IF_ERROR(check_id("pad_token_id", c.pad_token_id));
  for (int e : c.eos_token_ids) RETURN_IF_ERROR(check_id("eos_token_id", e));
  if (!c.tokenizer.empty() && c.tokenizer != "char") {
    return absl::InvalidArgumentError(
        absl::StrCat("config key 'tokenizer' = '", c.tokenizer, "': only \"char\" (built-in) or empty is supported"));
  }
  if (c.tokenizer == "char" && c.vocab_size < 99) {
    return bad("vocab_size", c.vocab_size, "must be >= 99 with the char tokenizer");
  }
  if (ParameterCount(c) > (int64_t{1} << 36)) {
    return absl::InvalidArgumentError("config describes more than 2^36 parameters; refusing");
  }
  return absl::OkStatus();
}

int64_t ParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size, v = c.vocab_size, i = c.intermediate_size;
  const int64_t d = c.HeadDim(), nh = c.num_attention_heads, nkv = c.KvHeads();
  int64_t layer = 2 * h + nh * d * h + 2 * nkv * d * h + h * nh * d + 3 * h * i;
  if (c.HasQkvBias()) layer += nh * d + 2 * nkv * d;
  if (c.HasQkNorm()) layer += 2 * d;
  int64_t total = v * h + c.num_hidden_layers * layer + h + int64_t{c.tandem_soft_prompt_tokens} * h;
  if (!c.tie_word_embeddings) total += v * h;
  return total;
}

std::string ToConfigJson(const ModelConfig& c) {
  json j;
  const char* architecture = c.model_type == "qwen2"     ? "Qwen2ForCausalLM"
                             : c.model_type == "qwen3"   ? "Qwen3ForCausalLM"
                             : c.model_type == "mistral" ? "MistralForCausalLM"
                                                         : "LlamaForCausalLM";
  j["architectures"] = json::array({architecture});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.KvHeads();
  j["head_dim"] = c.HeadDim();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.has_rope_scaling) {
    json rs;
    rs["rope_type"] = c.rope_scaling.rope_type;
    rs["factor"] = c.rope_scaling.factor;
    if (c.rope_scaling.original_max_position_embeddings > 0) {
      rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    }
    if (c.rope_scaling.rope_type == "llama3") {
      rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    }
    if (c.rope_scaling.rope_type == "yarn") {
      rs["beta_fast"] = c.rope_scaling.beta_fast;
      rs["beta_slow"] = c.rope_scaling.beta_slow;
      if (c.rope_scaling.attention_factor > 0) {
        rs["attention_factor"] = c.rope_scaling.attention_factor;
      }
    }
    j["rope_scaling"] = rs;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_bias"] = c.HasQkvBias();
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.pad_token_id >= 0) j["pad_token_id"] = c.pad_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  // Written explicitly for Mistral and Qwen, whose HF config classes
  // default an absent sliding_window to 4096.
  if (c.sliding_window_set || c.sliding_window > 0 || c.model_type != "llama") {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  }
  if (c.use_sliding_window_set || c.QwenFamily()) {
    j["use_sliding_window"] = c.use_sliding_window;
    j["max_window_layers"] = c.max_window_layers;
  }
  if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
  if (!c.tandem_layer_types.empty()) j[std::string(kLayerTypesKey)] = c.tandem_layer_types;
  if (c.tandem_soft_prompt_tokens > 0) j["tandem_soft_prompt_tokens"] = c.tandem_soft_prompt_tokens;
  j["torch_dtype"] = c.torch_dtype;
  if (!c.tokenizer.empty()) j["tokenizer"] = c.tokenizer;
  return j.dump(2) + "\n";
}

}  // namespace tandem::model
