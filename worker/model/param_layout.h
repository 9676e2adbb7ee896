// ParamLayout: the flat fp32 parameter layout of a model, with named views
// using the Hugging Face tensor names, grouped in units (see
// param_provider.h):
//   unit 0      model.embed_tokens.weight            (also the LM head if tied)
//               tandem.soft_prompt (config tandem_soft_prompt_tokens > 0)
//   unit 1+i    model.layers.{i}.input_layernorm.weight,
//               self_attn.{q,k,v}_proj.weight (+ .bias when the config has
//               q/k/v biases), self_attn.{q,k}_norm.weight (Qwen3),
//               self_attn.o_proj.weight, post_attention_layernorm.weight,
//               mlp.{gate,up,down}_proj.weight
//   unit L+1    model.norm.weight (+ lm_head.weight when untied)
// Every tensor starts at a multiple of kAlignFloats floats inside its unit and
// every unit size is a multiple of kAlignFloats, so unit offsets are aligned
// too; padding floats are zero and never used. The one exception is the
// soft prompt: it follows the embeddings without padding (token id
// vocab_size + i is its row i). tensors() is in offset order. Weights keep HF's [out, in]
// row-major shapes. FlatParamProvider serves units from two full flat
// buffers (params and grads) for single-process use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "worker/model/config.h"
#include "worker/model/param_provider.h"

namespace tandem::model {

inline constexpr size_t kAlignFloats = 16;  // 64 bytes
inline constexpr std::string_view kSoftPromptTensor = "tandem.soft_prompt";

struct TensorView {
  std::string name;            // HF name
  std::vector<int64_t> shape;  // HF shape
  int unit = 0;
  size_t offset_in_unit = 0;  // floats
  size_t offset = 0;          // floats, in the full flat buffer
  size_t numel = 0;
  enum class Kind { kMatrix, kNorm, kBias } kind = Kind::kMatrix;
};

// Offsets (floats, inside the layer's unit) of one decoder layer's tensors.
// Bias offsets are SIZE_MAX when the layout has no biases, q_norm/k_norm
// when it has no per-head q/k norms.
struct LayerOffsets {
  size_t input_norm, q, k, v, q_bias, k_bias, v_bias, q_norm, k_norm, o, post_norm, gate, up, down;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& config);

  int num_layers() const { return num_layers_; }
  int num_units() const { return num_layers_ + 2; }
  int layer_unit(int layer) const { return 1 + layer; }
  int final_unit() const { return num_layers_ + 1; }
  size_t unit_offset(int unit) const { return unit_offsets_[unit]; }
  size_t unit_size(int unit) const { return unit_sizes_[unit]; }
  size_t total_floats() const { return total_; }

  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(const std::string& name) const;

  const LayerOffsets& layer(int i) const { return layers_[i]; }
  size_t embed_offset() const { return embed_; }      // in unit 0
  size_t final_norm_offset() const { return norm_; }  // in final_unit()
  bool tied() const { return tied_; }
  // LM head: unit 0 / embed_offset() when tied, else final_unit().
  int lm_head_unit() const { return tied_ ? 0 : final_unit(); }
  size_t lm_head_offset() const { return lm_head_; }

 private:
  size_t Add(int unit, std::string name, std::vector<int64_t> shape, TensorView::Kind kind);

  int num_layers_ = 0;
  bool tied_ = false;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<size_t> unit_offsets_, unit_sizes_;
  std::vector<LayerOffsets> layers_;
  size_t embed_ = 0, norm_ = 0, lm_head_ = 0, total_ = 0;
};

// Params and grads in two caller-owned flat buffers of total_floats().
// Reference counting is not needed: every unit is always resident.
class FlatParamProvider final : public ParamProvider {
 public:
  FlatParamProvider(const ParamLayout& layout, float* params, float* grads)
      : layout_(layout), params_(params), grads_(grads) {}
  const float* AcquireParams(int unit) override { return params_ + layout_.unit_offset(unit); }
  void ReleaseParams(int) override {}
  float* AcquireGrads(int unit) override { return grads_ + layout_.unit_offset(unit); }
  void ReleaseGrads(int) override {}

 private:
  const ParamLayout& layout_;
  float* params_;
  float* grads_;
};

}  // namespace tandem::model
