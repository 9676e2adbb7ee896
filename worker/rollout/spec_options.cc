#include "worker/rollout/spec_options.h"

namespace tandem::rollout {

RolloutOptions OptionsFromSpec(const tandem::v1::JobSpec& spec, uint64_t seed) {
  const auto& rl = spec.rl();
  const auto& r = spec.rollout();
  RolloutOptions o;
  o.max_new_tokens = rl.max_new_tokens() > 0 ? rl.max_new_tokens() : 16;
  o.sampling.temperature = rl.temperature() > 0 ? static_cast<float>(rl.temperature()) : 1.f;
  o.sampling.top_p = rl.top_p() > 0 ? static_cast<float>(rl.top_p()) : 1.f;
  o.sampling.top_k = rl.top_k();
  o.sampling.min_p = static_cast<float>(r.min_p());
  o.sampling.repetition_penalty =
      r.repetition_penalty() > 0 ? static_cast<float>(r.repetition_penalty()) : 1.f;
  o.sampling.seed = seed;
  if (r.kv_cache_bytes() > 0) o.kv_cache_bytes = static_cast<size_t>(r.kv_cache_bytes());
  o.kv_dtype = r.kv_dtype() == "bf16" ? kernels::KvDtype::kBF16 : kernels::KvDtype::kF32;
  if (r.block_size() > 0) o.block_size = r.block_size();
  if (r.max_batch_tokens() > 0) o.max_batch_tokens = r.max_batch_tokens();
  if (r.max_seqs() > 0) o.max_seqs = r.max_seqs();
  o.share_prompts = !r.no_prompt_sharing();
  return o;
}

}  // namespace tandem::rollout
