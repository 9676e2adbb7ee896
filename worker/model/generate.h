// Batched generation: prefill (packed varlen forward of all prompts, filling
// a KV cache [batch, capacity, Hkv, D] per layer) then incremental decode
// with Ops::decode_attention, one token per live sequence per step; both
// run the shared Decoder (decoder.h) over one scratch buffer per activation.
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
// and stay until Release() or destruction. They live in `memory`, the
// backend's device memory (nullptr: a host memory owned by the generator);
// the ParamProvider's pointers are device pointers of it. Sampling runs on
// the host over each step's logits, downloaded [live, V]; each step uploads
// its token ids, positions and cache lengths (one copy). New k/v rows go
// into the caches with one scatter op per layer (Ops::embedding_backward
// into rows kept zero past each sequence's length), so a decode step issues
// no per-sequence copies. A failed allocation is ResourceExhausted. One
// thread at a time. Dynamic-NTK RoPE uses one base for the whole call,
// computed from the call's capacity (longest prompt + max_new_tokens),
// whereas HF recomputes it as the sequence grows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/decoder.h"
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
  bool stop_at_eos = true;        // the config's eos_token_ids stop a sequence
  std::vector<int32_t> stop_ids;  // further stop ids
  // Called with (prompt index, token) after every generated token that is
  // not a stop id; true ends that sequence there (FinishReason::kStop), e.g.
  // when its decoded text now contains a stop string. Runs on the calling
  // thread.
  std::function<bool(size_t, int32_t)> stop_check;
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
  // `ops` and `memory` must outlive the generator.
  Generator(const ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory = nullptr);

  // `sequence_ids` (optional, one per prompt) key the random draws; by
  // default prompt i uses id i.
  absl::StatusOr<GenerationResult> Generate(const std::vector<std::vector<int32_t>>& prompts,
                                            const SamplingOptions& options, ParamProvider& params,
                                            std::span<const uint64_t> sequence_ids = {});

  // Frees the KV cache and scratch.
  void Release();
  size_t kv_cache_bytes() const;

 private:
  // Runs in.rows tokens through the decoder, writing their k/v into the
  // caches, and the logits of n_out rows (out_rows, or rows 0..n_out-1) to
  // logits_d_ [n_out, V]. Prefill: the packed prompts, slot s = sequence s.
  // Decode: one row per live slot.
  void Step(ParamProvider& pp, DecoderInput in, const int32_t* out_rows, int n_out);
  absl::Status Ensure(int batch, int capacity, int rows);
  // Uploads idx_host_ (its first n entries) to idx_d_.
  void UploadIndices(size_t n);

  const ModelConfig& config() const { return decoder_.config(); }

  Decoder decoder_;
  DecoderDims d_;               // decoder_.dims()
  kernels::Ops* ops_;           // decoder_.ops()
  kernels::DeviceMemory* mem_;  // decoder_.memory()

  int batch_cap_ = 0, seq_cap_ = 0, rows_cap_ = 0, out_cap_ = 0;
  // Device: per layer [batch, cap, Hkv, D].
  std::vector<kernels::DeviceArray<float>> kc_, vc_;
  std::vector<int32_t> cache_len_;  // host copy of the slots' cache lengths
  // Device scratch: rows_cap_ rows (x_ .. h_), out_cap_ rows (hn_, logits_d_).
  kernels::DeviceArray<float> x_, xn_, q_, k_, v_, attn_, lse_, gate_, up_, h_, hn_, logits_d_;
  // With q/k norms (Qwen3): k before its norm (q's goes through attn_).
  kernels::DeviceArray<float> kraw_;
  // Device index arrays (one allocation) and their host staging.
  kernels::DeviceArray<int32_t> idx_d_;
  std::vector<int32_t> idx_host_;
  std::vector<float> logits_;  // host copy of the step's logits [live, V]
                               // (host sampling: top-k / top-p only)
  // Device sampling (Ops::sample_logits): per-row uniforms in, token ids and
  // [sample log-prob | raw log-prob] out; out_cap_ rows each.
  kernels::DeviceArray<double> u_d_;
  kernels::DeviceArray<int32_t> pick_id_d_;
  kernels::DeviceArray<float> pick_lp_d_;
  std::vector<double> u_host_;
  std::vector<int32_t> pick_id_host_;
  std::vector<float> pick_lp_host_;
};

// The counter-based uniform in [0, 1) used for sampling (exposed for tests).
double SampleUniform(uint64_t seed, uint64_t sequence_id, uint64_t token_index);

}  // namespace tandem::model
