// The tiny Llama model and data the ZeRO tests train: its config, its ZeRO
// units, and sample i of step s (derived from (step, index) only, never from
// the rank, so any N sees the same data).
#pragma once

#include <cstdint>
#include <vector>

#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::zero::test_model {

inline model::ModelConfig TinyConfig() {
  model::ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = true;  // unit 0 used at both ends
  return c;
}

inline std::vector<Unit> UnitsOf(const model::ParamLayout& layout) {
  std::vector<Unit> units;
  for (int u = 0; u < layout.num_units(); ++u) {
    units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  }
  return units;
}

// An arithmetic progression of tokens: a "prompt" of kPrompt tokens and a
// "completion" that continues it.
constexpr int kPrompt = 5;
inline std::vector<int32_t> MakeSequence(int step, int index, int vocab) {
  const int a = (7 * step + 13 * index + 3) % vocab;
  const int b = 1 + (step + 3 * index) % 5;
  const int len = 10 + (index + step) % 4;
  std::vector<int32_t> seq(len);
  for (int k = 0; k < len; ++k) seq[k] = (a + k * b) % vocab;
  return seq;
}

}  // namespace tandem::zero::test_model
