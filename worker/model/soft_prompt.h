// Soft prompts (prompt tuning): a model config with
// tandem_soft_prompt_tokens = n has n extra embedding rows, the tensor
// tandem.soft_prompt [n, hidden_size], right after the token embeddings.
// Token id vocab_size + i reads row i, so a sequence that starts with
// SoftPromptIds runs behind the soft prompt with no change to the
// kernels: the embedding lookup reads the rows and its backward
// accumulates their gradients, and train.trainable: [tandem.soft_prompt]
// trains them alone with the rest of the model frozen. Pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"

namespace tandem::model {

// vocab_size .. vocab_size + n - 1 (empty without a soft prompt).
std::vector<int32_t> SoftPromptIds(const ModelConfig& config);

// Row i of the soft prompt = the embedding of token (2i + 1) V / (2n):
// n vocabulary embeddings spread over the vocabulary, the usual prompt
// tuning initialization. No-op when the layout has no soft prompt.
void InitSoftPrompt(const ParamLayout& layout, float* params);

// The parameters of `base` (a config without a soft prompt, `params` in
// its layout) in the layout of the same model with `tokens` soft-prompt
// rows: every tensor copied by name, the soft prompt from InitSoftPrompt.
// `with` gets the new config. InvalidArgument when `base` already has a
// soft prompt or the new config is invalid.
absl::StatusOr<std::vector<float>> AddSoftPrompt(const ModelConfig& base, const std::vector<float>& params, int tokens,
                                                 ModelConfig* with);

}  // namespace tandem::model
