#include "worker/model/soft_prompt.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace tandem::model {

std::vector<int32_t> SoftPromptIds(const ModelConfig& config) {
  std::vector<int32_t> ids(static_cast<size_t>(std::max(config.tandem_soft_prompt_tokens, 0)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = config.vocab_size + static_cast<int32_t>(i);
  return ids;
}

void InitSoftPrompt(const ParamLayout& layout, float* params) {
  const TensorView* soft = layout.Find(std::string(kSoftPromptTensor));
  if (soft == nullptr) return;
  const TensorView* embed = layout.Find("model.embed_tokens.weight");
  TANDEM_CHECK(embed != nullptr && embed->shape[1] == soft->shape[1]);
  const int64_t V = embed->shape[0], n = soft->shape[0], C = soft->shape[1];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = std::min(V - 1, (2 * i + 1) * V / (2 * n));
    const float* src = params + embed->offset + static_cast<size_t>(id * C);
    std::copy(src, src + C, params + soft->offset + static_cast<size_t>(i * C));
  }
}

absl::StatusOr<std::vector<float>> AddSoftPrompt(const ModelConfig& base, const std::vector<float>& params, int tokens,
                                                 ModelConfig* with) {
  if (base.tandem_soft_prompt_tokens != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model already has a soft prompt of ", base.tandem_soft_prompt_tokens, " tokens"));
  }
  ModelConfig c = base;
  c.tandem_soft_prompt_tokens = tokens;
  if (absl::Status st = Validate(c); !st.ok()) return st;
  const ParamLayout from(base), to(c);
  TANDEM_CHECK(params.size() == from.total_floats());
  std::vector<float> out(to.total_floats(), 0.f);
  for (const TensorView& t : from.tensors()) {
    const TensorView* dst = to.Find(t.name);
    TANDEM_CHECK(dst != nullptr && dst->numel == t.numel);
    std::copy(params.begin() + t.offset, params.begin() + t.offset + t.numel, out.begin() + dst->offset);
  }
  InitSoftPrompt(to, out.data());
  *with = c;
  return out;
}

}  // namespace tandem::model
