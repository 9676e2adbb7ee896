// JobContext: everything a worker holds for the job it runs — the model and
// its workspace, the communicator and ZeRO state, data, the RL step's
// trajectories — created by PHASE_SETUP and destroyed by PHASE_TEARDOWN (or
// an abort). Owned by the engine; used from the engine's job thread only,
// except `abort` and `collective`, whose Abort() the engine may call from any
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "tandem/v1/cluster.pb.h"
#include "worker/ckpt/async_writer.h"
#include "worker/comm/collective.h"
#include "worker/comm/node_collectives.h"
#include "worker/comm/store.h"
#include "worker/comm/tiered_collective.h"
#include "worker/engine/compute_device.h"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/model/tokenizer.h"
#include "worker/rl/reward_client.h"
#include "worker/rl/rewards.h"
#include "worker/rl/rollout.h"
#include "worker/rl/sft_data.h"
#include "worker/rl/tasks.h"
#include "worker/rl/text_data.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/tp_decoder.h"
#include "worker/text/text_tokenizer.h"
#include "worker/zero/sharded_params.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::worker {

class PeerSnapshots;  // worker/engine/peer_snapshot.h
class DisaggState;    // worker/engine/disagg.h

struct RlStepState {
  int64_t step = 0;
  std::vector<rl::Example> examples;         // this rank's prompts
  std::vector<const rl::TextRow*> rows;      // their data rows (text data)
  std::vector<int64_t> prompt_index;         // global index of each prompt
  std::vector<rl::Trajectory> trajectories;  // group-major, G per prompt
  std::vector<std::vector<float>> logp_old;  // per trajectory, per completion token
  // One epoch of one mini-batch: the update's own forward runs on the
  // weights LOGPROBS would have used, so logp_old is not computed.
  bool old_is_current = false;
  std::vector<std::vector<float>> logp_ref;
  bool scored = false;
  bool have_logprobs = false;
};

struct JobContext {
  tandem::v1::Assignment assignment;
  const tandem::v1::JobSpec& spec() const { return assignment.spec(); }
  int rank = 0;
  int world = 1;

  model::ModelConfig config;
  // The backend (ops, memory) the model, rollout engine and ZeRO state use;
  // declared before them so it is destroyed after them.
  std::unique_ptr<ComputeDevice> device;
  // Tensor-parallel rollout (rollout.tp_size > 1): this rank's TP group
  // (ranks rank / tp_size * tp_size .. + tp_size - 1; made at SETUP with
  // the job's abort signal); declared before `rollout`, whose forward uses
  // it, so it is destroyed after it.
  std::unique_ptr<comm::Collective> tp_group;
  std::unique_ptr<model::Model> model;
  // Layer-major accumulation (grad_accumulation.h): one more model (its
  // workspace keeps a pass's activations) per pass of a step beyond the first.
  std::vector<std::unique_ptr<model::Model>> micro_models;
  // Every generation (GRPO rollouts, EVAL): continuous batching over a
  // paged KV cache.
  std::unique_ptr<rollout::RolloutEngine> rollout;
  // With tp_group: GRPO's tensor-parallel rollout engine, its forward (owned
  // by `tp_rollout`) and, during a ROLLOUT phase only, this rank's TP slice
  // of the weights. EVAL keeps `rollout`: every rank evaluates its own
  // prompts, which a TP group (all ranks on the same requests) cannot do.
  std::unique_ptr<rollout::RolloutEngine> tp_rollout;
  rollout::TpDecoder* tp_decoder = nullptr;
  kernels::DeviceArray<float> tp_slice;
  // With rollout.shift_parallel, during a ROLLOUT phase only: the full
  // weights for the sequence-parallel steps (beside the slice).
  kernels::DeviceArray<float> tp_full;
  // The model's tokenizer (char or Hugging Face); null for ids-only models.
  std::shared_ptr<const text::Tokenizer> tokenizer;
  // Generation stops at these ids: the model's eos ids (config.json,
  // generation_config.json, the tokenizer's eos) and rl.stop_token_ids.
  std::vector<int32_t> stop_ids;
  // The soft prompt's ids (model/soft_prompt.h) that start every SFT
  // sequence, rollout prompt and eval prompt; empty without one.
  std::vector<int32_t> soft_prompt;

  std::shared_ptr<const rl::Task> task;
  std::optional<rl::SftDataset> dataset;
  // Text data (data.train / data.eval) and its verifiable reward.
  std::optional<rl::TextDataset> train_data;
  std::optional<rl::TextDataset> eval_data;
  std::unique_ptr<rl::VerifiableReward> reward;
  std::string data_log;  // what SETUP says about the data (rank 0)
  std::unique_ptr<rl::RewardClient> reward_client;

  std::unique_ptr<comm::Store> store;
  // Aborts this context's rendezvous and communicators (SETUP in progress
  // included); made by the engine, which may fire it from any thread.
  std::shared_ptr<comm::AbortSignal> abort;
  std::unique_ptr<comm::Collective> collective;
  // cluster.shard_by_speed: every rank's speed (the same table on every
  // rank, exchanged at SETUP; speed_shares.h). Empty: even shares.
  std::vector<double> speeds;
  // Sequence parallelism (cluster.sequence_parallel = sp_size > 1): this
  // rank is sp_rank of the group of ranks [rank - sp_rank, + sp_size), which
  // splits every packed micro-batch (model::SliceBatch); the model computes
  // attention through sp_attention over sp_group. Aborted with `abort`.
  int sp_size = 1;
  int sp_rank = 0;
  std::unique_ptr<comm::Collective> sp_group;
  std::unique_ptr<model::SequenceAttention> sp_attention;
  // How a micro-batch splits over the group: rows weighed by the model's
  // estimated work (causal layers make later rows heavier).
  model::SliceCost slice_cost;
  // Where the ranks run (assignment.topology; one node when the coordinator
  // sent none) and the bytes the communicators moved per tier since the
  // last step report.
  std::vector<std::string> rank_nodes;
  std::shared_ptr<comm::TierLedger> tier_bytes = std::make_shared<comm::TierLedger>();
  // zero.hierarchical_partition: the intra- and inter-node communicators
  // (made with `abort`, so the engine's Abort() reaches them too).
  std::optional<comm::NodeCollectives> nodes;
  std::unique_ptr<zero::ZeroOptimizer> zero;

  // Frozen reference policy for the KL term (GRPO): full fp32 copy in host
  // memory, only when kl_coef > 0. Whoever replaces it calls
  // ref_device.reset(); RefParamsOnDevice (grpo_phases.cc) re-uploads.
  std::vector<float> ref_params;
  kernels::DeviceArray<float> ref_device;  // device copy (not for host memory)
  // rl.shard_reference: the reference instead as this rank's shard (ZeRO-3
  // partition, worker/zero/sharded_params.h), gathered unit by unit during
  // LOGPROBS; ref_params then stays empty.
  std::unique_ptr<zero::ShardedParams> ref_shard;

  RlStepState rl;
  int64_t optimizer_steps = 0;  // completed optimizer steps (lr schedule)
  int64_t policy_version = 0;   // weights version (RL updates)
  // The training step (SFT_STEP or UPDATE; warm-start steps are negative)
  // whose result the live parameters and optimizer state are: set when a
  // training phase has applied all its optimizer steps (or by a restore),
  // cleared while an UPDATE is between its optimizer steps. At ZeRO stage 0
  // an optimizer step changes nothing unless it succeeds, so a phase that
  // fails before its step leaves the previous value valid. Degraded
  // continuation hands this state to the next generation (live_restore.h).
  std::optional<int64_t> last_trained_step;

  // Checkpoints: root directory and the background writer (declared after
  // the store/collective it uses, so it is destroyed - and drained - first).
  std::string checkpoint_root;
  std::unique_ptr<ckpt::AsyncWriter> writer;
  // Set by the writer thread when this rank (rank 0) published a checkpoint
  // (step, directory, size on disk); read and cleared by the job thread when
  // it fills the next report.
  std::mutex published_mu;
  std::vector<tandem::v1::PublishedCheckpoint> published;

  comm::Timeout timeout{60000};

  // In-memory peer copies (owned by the engine: they outlive this context).
  PeerSnapshots* peer = nullptr;

  // Disaggregated mode (worker/engine/disagg.h); null when co-located.
  // Declared last: destroyed first, so its generation thread is joined
  // before the model and rollout engine it uses go away.
  std::shared_ptr<DisaggState> disagg;
};

}  // namespace tandem::worker
