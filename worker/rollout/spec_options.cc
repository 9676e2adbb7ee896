#include "worker/rollout/spec_options.h"

#include <algorithm>

namespace tandem::rollout {

// `spec` has the job-spec table's defaults applied (SetupJob does it).
RolloutOptions OptionsFromSpec(const tandem::v1::JobSpec& spec, uint64_t seed, size_t memory_bytes) {
  const auto& rl = spec.rl();
  const auto& r = spec.rollout();
  RolloutOptions o;
  o.max_new_tokens = rl.max_new_tokens();
  o.sampling.temperature = static_cast<float>(rl.temperature());
  o.sampling.top_p = static_cast<float>(rl.top_p());
  o.sampling.top_k = rl.top_k();
  o.sampling.min_p = static_cast<float>(r.min_p());
  o.sampling.repetition_penalty = static_cast<float>(r.repetition_penalty());
  o.sampling.seed = seed;
  if (r.kv_cache_bytes() > 0) o.kv_cache_bytes = static_cast<size_t>(r.kv_cache_bytes());
  if (r.kv_cache_fraction() > 0) {
    o.kv_cache_bytes =
        std::max<size_t>(1, static_cast<size_t>(r.kv_cache_fraction() * static_cast<double>(memory_bytes)));
  }
  o.kv_dtype = r.kv_dtype() == "bf16" ? kernels::KvDtype::kBF16 : kernels::KvDtype::kF32;
  o.block_size = r.block_size();
  o.max_batch_tokens = r.max_batch_tokens();
  o.max_seqs = r.max_seqs();
  o.share_prompts = !r.no_prompt_sharing();
  if (const auto& s = r.sparse(); s.top_k_blocks() > 0) {
    o.sparse = kernels::SparseDecodeParams{s.block_size(), s.top_k_blocks(), s.sink_blocks(), s.recent_blocks()};
  }
  return o;
}

}  // namespace tandem::rollout
