// BatchForward: the model forward of one rollout step, over a batch of rows
// that each name (sequence, position): decode rows and prefill chunks of
// several sequences mixed. Every row's k/v is written to its slot of the
// paged KV cache before attention, and each row attends over its sequence's
// block table. The scheduler and sampler only see this interface, so a
// tensor-parallel forward (heads split over ranks) can stand behind it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "worker/model/layer_types.h"
#include "worker/model/param_provider.h"
#include "worker/rollout/kv_pool.h"

namespace tandem::rollout {

// One step's rows. Every pointer is device memory of the forward's backend.
struct ForwardBatch {
  int rows = 0;
  const int32_t* tokens = nullptr;        // [rows]
  const int32_t* positions = nullptr;     // [rows]
  const int32_t* row_seq = nullptr;       // [rows] row of block_tables
  const int32_t* slots = nullptr;         // [rows] cache slot of each row's k/v
  const int32_t* block_tables = nullptr;  // [sequences, max_blocks]
  int max_blocks = 0;
  // A KvPool with a windowed layers' pool (KvPool::pool(l) == 1): that
  // pool's slots [rows] and block tables [sequences, max_blocks].
  const int32_t* windowed_slots = nullptr;
  const int32_t* windowed_block_tables = nullptr;
  // Rows whose logits are wanted (a row may repeat: samples of a shared
  // prompt read the same row).
  int num_out = 0;
  const int32_t* out_rows = nullptr;  // [num_out]
  // Rows whose input is a given embedding instead of a token's (context
  // embeddings): row context_rows[i] reads row context_src[i] of
  // context_table [*, hidden] (device); both index arrays are HOST memory.
  int num_context = 0;
  const int32_t* context_rows = nullptr;
  const int32_t* context_src = nullptr;
  const float* context_table = nullptr;
  // Top-k block-sparse attention in full-attention layers (nullptr: dense):
  // the KV pool then holds key summaries (forwards with supports_sparse()).
  const kernels::SparseDecodeParams* sparse = nullptr;
  // Layers with a recurrent state (linear attention): the rows are
  // num_chunks runs of consecutive positions of one sequence each, run i at
  // rows [chunk_rows[i], chunk_rows[i + 1]) (device, num_chunks + 1). Run i
  // continues the state in slot chunk_slot[i] of the KvPool and leaves its
  // last state there; a run whose first position chunk_start[i] is 0 starts
  // from zeros. chunk_slot, chunk_start and chunk_rows_host (chunk_rows'
  // values) are HOST memory.
  int num_chunks = 0;
  const int32_t* chunk_rows = nullptr;
  const int32_t* chunk_rows_host = nullptr;
  const int32_t* chunk_slot = nullptr;
  const int32_t* chunk_start = nullptr;

  // The slots and block tables of KV pool `pool` (KvPool::pool).
  const int32_t* slots_of(int pool) const { return pool == 1 ? windowed_slots : slots; }
  const int32_t* tables_of(int pool) const { return pool == 1 ? windowed_block_tables : block_tables; }
};

class BatchForward {
 public:
  virtual ~BatchForward() = default;
  // Scratch for up to `rows` rows and `outs` logits rows, and rotary
  // tables for positions 0..positions-1.
  virtual absl::Status Reserve(int rows, int outs, int positions) = 0;
  // Runs the batch, writing its k/v into `kv` and logits [num_out, V] to
  // logits() (device memory, valid until the next call).
  virtual absl::Status Forward(model::ParamProvider& params, KvPool& kv, const ForwardBatch& batch) = 0;
  virtual const float* logits() const = 0;
  virtual float* mutable_logits() = 0;
  // Frees the scratch.
  virtual void Release() = 0;

  // What the engine sizes around the forward: layers and the per-row k/v
  // width of the KV cache this forward reads and writes (a tensor-parallel
  // forward caches only its own heads), the logits width, the device memory
  // every pointer lives in, and the scratch bytes held.
  virtual int num_layers() const = 0;
  virtual int kv_dim() const = 0;
  virtual int vocab() const = 0;
  // Token ids the embedding reads: the vocabulary and the rows of a soft
  // prompt after it (model/soft_prompt.h).
  virtual int input_vocab() const { return vocab(); }
  // The residual width (a context-embedding row has this many floats) and
  // the model's context length in positions.
  virtual int hidden() const = 0;
  virtual int max_positions() const = 0;
  // Layer `layer`'s attention type (the engine refuses the kinds this
  // forward does not run).
  virtual const model::LayerType& layer_type(int layer) const = 0;
  virtual kernels::DeviceMemory* memory() const = 0;
  virtual size_t scratch_bytes() const = 0;
  // Whether Forward runs ForwardBatch::sparse.
  virtual bool supports_sparse() const { return false; }
  // Floats of one sequence's recurrent state in a linear-attention layer
  // (0: Forward does not run linear layers).
  virtual size_t linear_state_floats() const { return 0; }
};

}  // namespace tandem::rollout
