// RolloutEngine: generation for RL rollouts. Continuous batching with
// chunked prefill under a token budget (scheduler.h), a paged KV cache with
// a byte budget, preemption and recomputation when it is full (never a
// failure), shared prompt prefixes with copy-on-write, and sampling with one
// counter-based stream per sequence (sampler.h). The model forward is a
// BatchForward (batch_forward.h): by default a PagedDecoder on one device;
// a tensor-parallel forward (tp_decoder.h) makes every rank of its group run
// the same engine over the same requests, and every rank gets the same
// tokens.
//
// Every generation of the product runs here: GRPO rollouts, EVAL phases and
// `tandemctl generate`.
//
// Guarantees: greedy tokens equal those of recomputing the full forward at
// every step (up to fp32 rounding of a different batch shape); a sequence's
// tokens do not depend on which other sequences share its steps, nor on
// max_seqs, max_batch_tokens or block_size; every sampled token comes with
// its log-probs; the KV cache is allocated once per Generate, within the
// budget, and freed by Release (nothing is kept between rollout phases).
// Full and sliding-window layers read the paged KV cache; linear-attention
// layers keep no KV, only one recurrent state per running sequence (its
// slot in the KvPool, copied from the leader when a shared prompt forks; a
// preempted sequence recomputes from position 0). Sliding-window layers
// give back the blocks behind the widest window as sequences grow
// (scheduler.h); beside full-attention layers they keep a block pool of
// their own for it (kv_plan.h). Attention-sink layers (sink:S+window:N)
// read their sinks and window from the cache; they count as windowed layers
// there, and the blocks of the first S positions stay. With
// options.sparse, full-attention layers attend top-k blocks
// (Ops::paged_sparse_attention): tokens then follow that rule, and the
// guarantees on batch composition, sharing and preemption still hold.
//
// One thread at a time. `ops` and `memory` must outlive the engine; the
// ParamProvider gives device pointers of `memory`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/config.h"
#include "worker/model/param_provider.h"
#include "worker/rollout/kv_plan.h"
#include "worker/rollout/kv_pool.h"
#include "worker/rollout/paged_decoder.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/scheduler.h"

namespace tandem::rollout {

struct RolloutOptions {
  SamplingParams sampling;
  int max_new_tokens = 32;
  // A sampled stop id ends its sequence (and is kept in the output).
  std::vector<int32_t> stop_ids;
  // Called with (sequence index, token) after every sampled token that is
  // not a stop id; true ends that sequence (e.g. a stop string appeared).
  std::function<bool(size_t, int32_t)> stop_check;
  // KV cache budget; 0 = room for every sequence at full length.
  size_t kv_cache_bytes = 0;
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
  int block_size = 16;
  int max_batch_tokens = 2048;  // rows per step
  int max_seqs = 256;           // sequences running at once
  bool share_prompts = true;
  // Top-k block-sparse attention in full-attention layers (rollout.sparse;
  // unset: dense). Its block_size is a multiple of block_size.
  std::optional<kernels::SparseDecodeParams> sparse;
  // Admit new sequences only when none runs (a static-batch baseline for
  // benchmarks; scheduler.h).
  bool static_batch = false;
};

// One sequence to generate. Sequences with the same group (>= 0) must have
// equal prompts (their prefill is shared); `stream` keys the sampler's
// draws. `context`: n rows of hidden_size fp32 context embeddings (row
// major) placed before the prompt at positions 0..n-1, whose KV is computed
// from these vectors in place of token embeddings; the prompt may then be
// empty. A request with context never shares its prefill.
struct RolloutRequest {
  std::vector<int32_t> prompt;
  int group = -1;
  uint64_t stream = 0;
  std::vector<float> context = {};  // brace-initialised requests may leave it out
};

enum class Finish { kStop, kLength };

struct RolloutSequence {
  std::vector<int32_t> tokens;      // generated ids (stop id included)
  std::vector<float> logprobs;      // under the sampling distribution
  std::vector<float> raw_logprobs;  // under softmax(logits), temperature 1
  Finish finish = Finish::kLength;
};

struct RolloutResult {
  std::vector<RolloutSequence> sequences;  // one per request, same order
  int64_t prompt_tokens = 0;
  int64_t context_rows = 0;  // context embedding positions prefilled
  int64_t generated_tokens = 0;
  SchedulerStats scheduler;
  size_t kv_pool_bytes = 0;  // the cache allocated (linear-attention states included)
  size_t kv_peak_bytes = 0;  // blocks in use at the peak (of each pool), plus the states
  size_t state_bytes = 0;    // linear-attention states (one per running sequence)
  int num_blocks = 0;        // blocks of the (full layers') pool
  int windowed_blocks = 0;   // blocks of the windowed layers' own pool (0: none)
  double seconds = 0;
  double prefill_seconds = 0;  // steps that ran prompt positions
  double decode_seconds = 0;   // steps of decode rows only
};

class RolloutEngine {
 public:
  RolloutEngine(const model::ModelConfig& config, kernels::Ops* ops, kernels::DeviceMemory* memory = nullptr);
  // Runs `forward` (its memory() holds every buffer of the engine).
  RolloutEngine(std::unique_ptr<BatchForward> forward, kernels::Ops* ops);

  // InvalidArgument for no requests, an empty prompt, an id outside the
  // vocabulary or a bad option (named as its job-spec key).
  absl::StatusOr<RolloutResult> Generate(const std::vector<RolloutRequest>& requests, const RolloutOptions& options,
                                         model::ParamProvider& params);
  // Frees the KV cache and every scratch buffer.
  void Release();
  // Device bytes held now (KV cache and scratch).
  size_t held_bytes() const;

 private:
  absl::Status Check(const std::vector<RolloutRequest>& requests, const RolloutOptions& o) const;
  // Request i's context embeddings: whole rows, finite, within the context.
  absl::Status CheckContext(const RolloutRequest& r, size_t i, const RolloutOptions& o) const;
  absl::Status Ensure(int rows, int outs, int positions, size_t index_ints);

  std::unique_ptr<BatchForward> forward_;
  kernels::Ops* ops_;
  kernels::DeviceMemory* mem_;
  int vocab_;
  int hidden_;         // residual width: floats per context-embedding row
  int max_positions_;  // the model's context length
  KvPool kv_;
  // Device index arrays (one upload per step) and sampling buffers.
  kernels::DeviceArray<int32_t> idx_d_;
  kernels::DeviceArray<double> u_d_;
  kernels::DeviceArray<int32_t> pick_id_d_;
  kernels::DeviceArray<float> pick_lp_d_;
  kernels::DeviceArray<int32_t> seen_d_;  // [offsets | seen ids] (repetition penalty)
  // Every request's context rows, concatenated ([rows, hidden]), and the
  // context rows of one step (host).
  kernels::DeviceArray<float> context_d_;
  std::vector<int32_t> ctx_rows_, ctx_src_;
  // Each run's recurrent-state slot and first position (host).
  std::vector<int32_t> run_slot_, run_start_;
  std::vector<int32_t> idx_;
  std::vector<double> u_;
  std::vector<int32_t> pick_id_;
  std::vector<float> pick_lp_;
  std::vector<int32_t> seen_;
};

}  // namespace tandem::rollout
