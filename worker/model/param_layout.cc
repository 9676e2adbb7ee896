#include "worker/model/param_layout.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::model {

namespace {
size_t AlignUp(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
}  // namespace

size_t ParamLayout::Add(int unit, std::string name, std::vector<int64_t> shape, TensorView::Kind kind) {
  TensorView t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.unit = unit;
  t.kind = kind;
  t.numel = 1;
  for (int64_t s : t.shape) t.numel *= static_cast<size_t>(s);
  t.offset_in_unit = unit_sizes_[unit];
  unit_sizes_[unit] = AlignUp(unit_sizes_[unit] + t.numel);
  index_[t.name] = tensors_.size();
  tensors_.push_back(std::move(t));
  return tensors_.back().offset_in_unit;
}

ParamLayout::ParamLayout(const ModelConfig& c) {
  num_layers_ = c.num_hidden_layers;
  tied_ = c.tie_word_embeddings;
  const int64_t h = c.hidden_size, v = c.vocab_size, inter = c.intermediate_size;
  const int64_t d = c.HeadDim(), nh = c.num_attention_heads, nkv = c.KvHeads();
  const bool bias = c.HasQkvBias();
  unit_sizes_.assign(num_units(), 0);
  using K = TensorView::Kind;
  embed_ = Add(0, "model.embed_tokens.weight", {v, h}, K::kMatrix);
  if (c.tandem_soft_prompt_tokens > 0) {
    // Right behind the embeddings, unpadded, so that token id V + i reads
    // row i.
    TensorView t;
    t.name = std::string(kSoftPromptTensor);
    t.shape = {c.tandem_soft_prompt_tokens, h};
    t.unit = 0;
    t.numel = static_cast<size_t>(c.tandem_soft_prompt_tokens) * static_cast<size_t>(h);
    t.offset_in_unit = embed_ + static_cast<size_t>(v) * static_cast<size_t>(h);
    unit_sizes_[0] = AlignUp(t.offset_in_unit + t.numel);
    index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  layers_.resize(num_layers_);
  for (int i = 0; i < num_layers_; ++i) {
    const int u = layer_unit(i);
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerOffsets& l = layers_[i];
    l.input_norm = Add(u, p + "input_layernorm.weight", {h}, K::kNorm);
    l.q = Add(u, p + "self_attn.q_proj.weight", {nh * d, h}, K::kMatrix);
    l.k = Add(u, p + "self_attn.k_proj.weight", {nkv * d, h}, K::kMatrix);
    l.v = Add(u, p + "self_attn.v_proj.weight", {nkv * d, h}, K::kMatrix);
    if (bias) {
      l.q_bias = Add(u, p + "self_attn.q_proj.bias", {nh * d}, K::kBias);
      l.k_bias = Add(u, p + "self_attn.k_proj.bias", {nkv * d}, K::kBias);
      l.v_bias = Add(u, p + "self_attn.v_proj.bias", {nkv * d}, K::kBias);
    } else {
      l.q_bias = l.k_bias = l.v_bias = SIZE_MAX;
    }
    if (c.HasQkNorm()) {
      l.q_norm = Add(u, p + "self_attn.q_norm.weight", {d}, K::kNorm);
      l.k_norm = Add(u, p + "self_attn.k_norm.weight", {d}, K::kNorm);
    } else {
      l.q_norm = l.k_norm = SIZE_MAX;
    }
    l.o = Add(u, p + "self_attn.o_proj.weight", {h, nh * d}, K::kMatrix);
    l.post_norm = Add(u, p + "post_attention_layernorm.weight", {h}, K::kNorm);
    l.gate = Add(u, p + "mlp.gate_proj.weight", {inter, h}, K::kMatrix);
    l.up = Add(u, p + "mlp.up_proj.weight", {inter, h}, K::kMatrix);
    l.down = Add(u, p + "mlp.down_proj.weight", {h, inter}, K::kMatrix);
  }
  norm_ = Add(final_unit(), "model.norm.weight", {h}, K::kNorm);
  lm_head_ = tied_ ? embed_ : Add(final_unit(), "lm_head.weight", {v, h}, K::kMatrix);
  unit_offsets_.assign(num_units(), 0);
  size_t off = 0;
  for (int u = 0; u < num_units(); ++u) {
    unit_offsets_[u] = off;
    off += unit_sizes_[u];
  }
  total_ = off;
  for (TensorView& t : tensors_) t.offset = unit_offsets_[t.unit] + t.offset_in_unit;
}

const TensorView* ParamLayout::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tandem::model
