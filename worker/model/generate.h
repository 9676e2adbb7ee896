// Batched generation: prefill (packed varlen forward of all prompts, filling
// a KV cache [batch, capacity, Hkv, D] per layer) then incremental decode
// with Ops::decode_attention, one token per live sequence per step.
//
// Sampling: greedy, or temperature -> top-k -> top-p (HF order), drawing
// one uniform per (seed, sequence id, token index) from a counter-based hash
// (splitmix64), so a sequence's tokens do not depend on how prompts are
// batched. A sequence stops after an EOS/stop id (included in the output)
// or after max_new_tokens. Each generated token comes with its log-prob
// under the sampling distribution (0 for greedy) and under the raw model
// distribution at temperature 1 (what RL needs).
//
// The Generator owns its KV cache and scratch: they grow to the largest call
// and stay until Release() or destruction. Host memory, CPU backends only.
// One thread at a time. Dynamic-NTK RoPE uses one base for the whole call,
// computed from the call's capacity (longest prompt + max_new_tokens),
// whereas HF recomputes it as the sequence grows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/param_provider.h"

namespace tandem::model {

struct SamplingOptions {
  int max_new_tokens = 32;
  bool greedy = false;
  float temperature = 1.f;  // > 0
  int top_k = 0;            // 0 = off
  float top_p = 1.f;        // (0, 1]; 1 = off
  uint64_t seed = 0;
  bool stop_at_eos = true;  // the config's eos_token_ids stop a sequence
  std::vector<int32_t> stop_ids;  // further stop ids
};

enum class FinishReason { kStop, kLength };

struct GeneratedSequence {
  std::vector<int32_t> tokens;      // generated ids (stop id included)
  std::vector<float> logprobs;      // under the sampling distribution
  std::vector<float> raw_logprobs;  // under softmax(logits), temperature 1
  FinishReason finish = FinishReason::kLength;
};

struct GenerationResult {
  std::vector<GeneratedSequence> sequences;  // one per prompt, same order
  size_t kv_cache_bytes = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

class Generator {
 public:
  Generator(const ModelConfig& config, kernels::Ops* ops);

  // `sequence_ids` (optional, one per prompt) key the random draws; by
  // default prompt i uses id i.
  absl::StatusOr<GenerationResult> Generate(
      const std::vector<std::vector<int32_t>>& prompts,
      const SamplingOptions& options, ParamProvider& params,
      std::span<const uint64_t> sequence_ids = {});

  // Frees the KV cache and scratch.
  void Release();
  size_t kv_cache_bytes() const;

 private:
  // Runs `rows` tokens through all layers. Prefill: rows = packed prompt
  // tokens, sequences given by cu (slot s = sequence s). Decode: one row per
  // live slot, at position positions[row]. Leaves the final-normed hidden
  // states of `out_rows` (indices into rows) in hn_ [out_rows, C].
  void Forward(ParamProvider& pp, int rows, const int32_t* tokens,
               const int32_t* positions, bool prefill, const int32_t* cu,
               int num_seqs, const std::vector<int>& out_rows);
  void Ensure(int batch, int capacity, int rows);

  ModelConfig config_;
  ParamLayout layout_;
  kernels::Ops* ops_;
  int C_, H_, Hkv_, D_, I_, V_, L_, HD_, KD_;

  int batch_cap_ = 0, seq_cap_ = 0, rows_cap_ = 0;
  std::vector<std::vector<float>> kc_, vc_;  // per layer [batch, cap, Hkv, D]
  std::vector<int32_t> cache_len_;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, lse_, gate_, up_, h_, hn_,
      logits_;
  std::vector<float> cos_, sin_;
  int rope_rows_ = 0, rope_key_ = -1;
};

// The counter-based uniform in [0, 1) used for sampling (exposed for tests).
double SampleUniform(uint64_t seed, uint64_t sequence_id, uint64_t token_index);

}  // namespace tandem::model
