// The job spec's table: every key of tandem.v1.JobSpec with its default,
// range and help. docs/job-spec.md shows it (generated, config_doc.h).
// Paths are proto paths (init.sft_steps is the file's init.sft.steps).
#include "common/job_spec.h"

#include "common/config_table.h"

namespace tandem::common {
namespace {

constexpr double kMaxSteps = 1e9;
constexpr double kMaxWorkers = 4096;
constexpr double kMaxVocab = 1 << 21;

ConfigTable* MakeJobSpecTable() {
  auto* t = new ConfigTable;
  t->name = "job";
  t->message = tandem::v1::JobSpec::descriptor();
  t->optional_sections = {"model", "model.config", "model.config.rope_scaling", "recovery", "reward"};
  YamlProtoOptions& o = t->options;
  o.max_text_bytes = kMaxJobFileBytes;
  o.rules = {
      // Top level.
      {.path = "name", .doc_default = "`<kind>-job`", .max_len = 128, .help = "1-128 of A-Z a-z 0-9 . _ -"},
      {.path = "kind", .doc_default = "required", .min = 1, .help = "sft or grpo (ppo later)"},
      {.path = "seed",
       .def = "1",
       .zero_is_value = true,
       .help = "every random draw derives from (seed, step, sample index)"},
      {.path = "priority", .min = -1000, .max = 1000, .help = "higher is scheduled first, FIFO within a priority"},
      {.path = "output_dir",
       .doc_default = "`<runs_dir>/<job id>/final`",
       .help = "final model as a Hugging Face directory (safetensors, sharded above 5 GB, config.json, "
               "generation_config.json, tokenizer files; see operations.md)"},
      {.path = "resume_from",
       .help = "checkpoint directory (of any run) restored in SETUP; the job continues at the step after it, "
               "with the data order where it left off"},
      // model: inline config (Hugging Face config.json names) or a directory.
      // The model's own rules (model::Validate, worker/model/config.cc) check
      // the config's values; these rows give the defaults and the help.
      {.path = "model.from", .help = "path to an HF model directory (config.json + safetensors)"},
      {.path = "model.config.model_type",
       .doc_default = "`qwen2` with attention_bias, else `llama`",
       .help = "llama, mistral, qwen2, qwen3 (Qwen3: RMSNorm on each q and k head; Mistral: sliding_window "
               "without sliding_window_layers applies to every layer)"},
      {.path = "model.config.vocab_size", .doc_default = "required", .help = "tokens in the embedding"},
      {.path = "model.config.hidden_size",
       .doc_default = "required",
       .help = "without head_dim: divisible by num_attention_heads, head size even"},
      {.path = "model.config.head_dim", .doc_default = "hidden_size / heads", .help = "even (rotary embeddings)"},
      {.path = "model.config.intermediate_size", .doc_default = "required", .help = "MLP width"},
      {.path = "model.config.num_hidden_layers", .doc_default = "required", .help = "decoder layers"},
      {.path = "model.config.num_attention_heads", .doc_default = "required", .help = "query heads"},
      {.path = "model.config.num_key_value_heads",
       .def_from = "model.config.num_attention_heads",
       .help = "divides num_attention_heads (grouped-query attention)"},
      {.path = "model.config.rms_norm_eps", .def = "1e-05", .help = "(0, 1]"},
      {.path = "model.config.rope_theta", .def = "10000", .help = "rotary base, > 1"},
      {.path = "model.config.rope_scaling.rope_type",
       .doc_default = "none",
       .help = "default, linear, dynamic, yarn, llama3 (alias `type`)"},
      {.path = "model.config.rope_scaling.factor", .help = "in [1, 1024] unless rope_type is default"},
      {.path = "model.config.rope_scaling.original_max_position_embeddings",
       .help = "0 = max_position_embeddings; llama3: required"},
      {.path = "model.config.rope_scaling.beta_fast", .doc_default = "32", .help = "yarn"},
      {.path = "model.config.rope_scaling.beta_slow", .doc_default = "1", .help = "yarn"},
      {.path = "model.config.rope_scaling.attention_factor", .help = "yarn; 0 = 0.1 ln(factor) + 1"},
      {.path = "model.config.rope_scaling.low_freq_factor", .help = "llama3: required, > 0"},
      {.path = "model.config.rope_scaling.high_freq_factor", .help = "llama3: required, > low_freq_factor"},
      {.path = "model.config.max_position_embeddings", .def = "2048", .help = "longest sequence"},
      {.path = "model.config.tie_word_embeddings", .help = "the output layer shares the embedding"},
      {.path = "model.config.attention_bias", .help = "biases on q, k, v (always with qwen2, never with mistral)"},
      {.path = "model.config.sliding_window_layers",
       .max_len = 1024,
       .help = "distinct layer indices < num_hidden_layers that use the sliding window"},
      {.path = "model.config.sliding_window", .help = ">= 1 when sliding_window_layers is set"},
      {.path = "model.config.tandem_layer_types",
       .max_len = 1024,
       .help = "Tandem extension, one entry per layer: full, window:N, sink:S+window:N or linear "
               "(docs/parallelism.md); not with sliding_window_layers"},
      {.path = "model.config.tokenizer", .def = "char", .help = "`char` (built in) or \"\" (ids only)"},
      {.path = "model.config.bos_token_id", .help = "< vocab_size"},
      {.path = "model.config.eos_token_id", .help = "< vocab_size"},
      {.path = "model.config.pad_token_id", .help = "< vocab_size"},
      // task: a built-in task or SFT data.
      {.path = "task.name",
       .doc_default = "`arithmetic` (without task.data and data.train)",
       .one_of = {"", "arithmetic", "sort", "reverse", "count"},
       .help = "built-in task"},
      {.path = "task.op", .doc_default = "`add` (arithmetic)", .one_of = {"", "add", "mul"}, .help = "arithmetic only"},
      {.path = "task.digits", .doc_default = "2 (arithmetic)", .min = 0, .max = 9, .help = "arithmetic only"},
      {.path = "task.min_len", .def = "3", .min = 1, .max = 256, .help = "sort/reverse/count; <= max_len"},
      {.path = "task.max_len", .def = "8", .min = 1, .max = 256, .help = "sort/reverse/count"},
      {.path = "task.data", .help = "JSONL file of SFT examples (char tokenizer or ids); sft only"},
      {.path = "task.eval_size", .def = "100", .min = 0, .max = 1e6, .help = "held-out examples (data: eval rows)"},
      {.path = "task.format_reward", .min = 0, .max = 100, .help = "extra reward for a well-formed answer"},
      {.path = "task.partial_reward",
       .min = 0,
       .max = 1,
       .help = "credit for a well-formed wrong answer, times the fraction of positions (aligned at the end) it "
               "gets right"},
      {.path = "task.reward_service", .max_len = 256, .help = "host:port of an external RewardService"},
      {.path = "task.reward_timeout_ms",
       .def = "10000",
       .min = 1,
       .max = 3.6e6,
       .help = "timeout of one reward service call"},
      // data: real data (JSONL rows with the tokenizer of model.from).
      {.path = "data.train", .help = "JSONL file; needs model.from"},
      {.path = "data.eval",
       .help = "JSONL file, evaluated on its first task.eval_size rows; grpo: pass@1 (greedy) and mean@k; sft: "
               "eval_loss and eval_exact_match on rows with a response"},
      {.path = "data.prompt_key", .max_len = 256, .help = "raw prompt text (exactly one of prompt_key, messages_key)"},
      {.path = "data.messages_key",
       .max_len = 256,
       .help = "chat messages [{role, content}, ...], rendered with the chat template, add_generation_prompt true"},
      {.path = "data.answer_key", .max_len = 256, .help = "reference answer (required for grpo)"},
      {.path = "data.system_prompt",
       .max_len = 65536,
       .help = "a system turn (chat), else text put before the prompt and a blank line"},
      {.path = "data.response_key",
       .max_len = 256,
       .help = "SFT target (sft, or a grpo warm start); with messages_key: the final assistant turn"},
      {.path = "data.chat", .help = "with prompt_key: the text as a user turn, rendered with the chat template"},
      {.path = "data.max_prompt_tokens", .min = 0, .max = 1 << 24, .help = "0 = no limit"},
      {.path = "data.prompt_overflow",
       .def = "drop",
       .one_of = {"drop", "truncate"},
       .help = "a prompt over max_prompt_tokens: dropped, or truncated to its last tokens; counted in metrics"},
      {.path = "data.shuffle",
       .def = "true",
       .zero_is_value = true,
       .help = "a seeded permutation of the rows per epoch"},
      {.path = "data.skip_bad_rows",
       .help = "false: a bad row fails SETUP with FILE:LINE: what; true: skipped and counted"},
      {.path = "data.eval_samples",
       .min = 0,
       .max = 1024,
       .help = "k > 0: also eval_mean_at_k, the accuracy of k samples per eval prompt at rl.temperature"},
      // reward: verifiable reward of a grpo job on data.
      {.path = "reward.type",
       .doc_default = "required for grpo on data (unless task.reward_service)",
       .one_of = {"", "gsm8k", "math", "exact", "regex"},
       .help = "how the answer is extracted and compared"},
      {.path = "reward.pattern",
       .help = "regex: PCRE2 pattern; its last match's first group (or the whole match) is the answer"},
      {.path = "reward.format_reward", .min = 0, .max = 100, .help = "added when the response is well formed"},
      {.path = "reward.format_pattern",
       .help = "PCRE2 pattern that defines \"well formed\" (e.g. `(?s)^<think>.*</think>`)"},
      // train.
      {.path = "train.steps", .def = "100", .min = 1, .max = kMaxSteps, .help = "SFT steps, or RL steps for grpo"},
      {.path = "train.lr", .def = "0.001", .min = 0, .max = 10, .min_exclusive = true, .help = "peak learning rate"},
      {.path = "train.global_batch",
       .def = "16",
       .min = 1,
       .max = 1 << 20,
       .help = "divisible by micro_batch x train workers (sft, and grpo with a warm start)"},
      {.path = "train.micro_batch", .def = "4", .min = 1, .max = 1 << 20, .help = "examples per forward pass"},
      {.path = "train.warmup_steps", .min = 0, .max = kMaxSteps, .help = "linear warm-up"},
      {.path = "train.min_lr_ratio",
       .def = "0.1",
       .zero_is_value = true,
       .min = 0,
       .max = 1,
       .help = "cosine decay floor, a fraction of lr"},
      {.path = "train.weight_decay", .min = 0, .max = 10, .help = "AdamW decoupled weight decay"},
      {.path = "train.beta1", .def = "0.9", .zero_is_value = true, .min = 0, .max = 0.999999, .help = "Adam"},
      {.path = "train.beta2", .def = "0.95", .min = 0, .max = 0.999999, .help = "Adam"},
      {.path = "train.eps", .def = "1e-08", .min = 0, .max = 1, .min_exclusive = true, .help = "Adam"},
      {.path = "train.grad_clip",
       .def = "1",
       .zero_is_value = true,
       .min = 0,
       .max = 1e6,
       .help = "global gradient norm clip; 0 = off"},
      {.path = "train.eval_every",
       .min = 0,
       .max = kMaxSteps,
       .help = "0 = only after the last step; else every N steps and after the last"},
      {.path = "train.seq_len", .min = 0, .max = 1 << 24, .help = "0 = the model's max_position_embeddings"},
      {.path = "train.precision",
       .def = "fp32",
       .one_of = {"fp32", "bf16"},
       .help = "bf16: bf16 compute copy of the weights, fp32 masters, gradients and Adam state"},
      {.path = "train.trainable",
       .doc_default = "every parameter",
       .max_len = 1024,
       .non_empty = true,
       .help = "glob patterns (`*`, `?`, `[...]`) over the Hugging Face tensor names; only matching tensors get "
               "gradients and optimizer state, the others stay frozen; a pattern that matches nothing is an error"},
      {.path = "train.soft_prompt_tokens",
       .doc_default = "the model's own (none)",
       .min = 0,
       .max = 1 << 16,
       .help = "prompt tuning: a soft prompt of this many trainable embedding rows (tensor `tandem.soft_prompt`, "
               "initialized from spread vocabulary embeddings) runs in front of every training sequence and prompt; "
               "with `train.trainable: [tandem.soft_prompt]` it trains alone. Saved with the model "
               "(config.json `tandem_soft_prompt_tokens`); a model that has one must be given the same number"},
      {.path = "train.activation_checkpointing",
       .def = "none",
       .one_of = {"none", "selective", "layer"},
       .help = "what the backward recomputes instead of keeping: layer keeps each decoder layer's input only, "
               "selective recomputes the attention internals (q, k, v, attention output); gradients are identical"},
      {.path = "train.accumulation",
       .def = "micro_batch",
       .one_of = {"micro_batch", "layer_major"},
       .help = "layer_major: forward all micro-batches, then backward layer by layer over them; each layer's "
               "gradient is reduced once per step, overlapping the backward (activations of all micro-batches "
               "are kept)"},
      {.path = "train.zenflow.topk_fraction",
       .min = 0,
       .max = 1,
       .help = "ZenFlow: fraction of each weight matrix's rows (by gradient norm) updated on the device every "
               "step; the others are accumulated and updated by a host thread every update_interval steps; "
               "0 = off (plain AdamW); ZeRO stages 0-2, fp32"},
      {.path = "train.zenflow.update_interval",
       .def = "4",
       .min = 1,
       .max = 1 << 20,
       .help = "ZenFlow: steps between host updates of the unimportant rows (S)"},
      {.path = "train.zenflow.select_interval",
       .def = "8",
       .min = 1,
       .max = 1 << 20,
       .help = "ZenFlow: steps between re-selections of the important rows; a multiple of update_interval"},
      {.path = "train.zenflow.full_warm_up_steps",
       .def = "0",
       .min = 0,
       .max = 1 << 30,
       .help = "ZenFlow: the first steps run plain AdamW on every row (DeepSpeed's full_warm_up_rounds); the "
               "first selection is at the step after them; a multiple of update_interval"},
      // zero: communication techniques of the ZeRO optimizer.
      {.path = "zero.grad_compression",
       .def = "none",
       .one_of = {"none", "int4"},
       .help = "int4: LoCo, 4-bit blockwise gradient reduce-scatter (stages 2-3) and allreduce (stages 0-1)"},
      {.path = "zero.error_feedback",
       .def = "true",
       .zero_is_value = true,
       .help = "int4: carry each rank's quantisation error into the next reduction"},
      {.path = "zero.hierarchical_partition",
       .help = "stage 3 (hpZ): a secondary copy of the parameter shards partitioned inside each node, so "
               "forward/backward gathers stay intra-node; gradients reduce-scatter intra-node, then inter-node "
               "(fp32 or bf16; cpu and cuda devices)"},
      {.path = "zero.weight_quantization",
       .def = "none",
       .one_of = {"none", "int8"},
       .help = "int8 (qwZ): blockwise int8 weights with fp32 scales for stage-3 parameter gathers (fp32 or bf16; cpu "
               "and cuda devices, quantised where "
               "the weights live)"},
      // rl (grpo).
      {.path = "rl.group_size", .def = "8", .min = 2, .max = 4096, .help = "samples per prompt"},
      {.path = "rl.prompts_per_step",
       .def = "8",
       .min = 1,
       .max = 1 << 20,
       .help = "divisible by the (rollout) workers"},
      {.path = "rl.clip", .def = "0.2", .min = 0, .max = 10, .min_exclusive = true, .help = "PPO clip epsilon (low)"},
      {.path = "rl.clip_high", .def_from = "rl.clip", .min = 0, .max = 10, .help = ">= clip (asymmetric clip)"},
      {.path = "rl.kl_coef",
       .def = "0.01",
       .zero_is_value = true,
       .min = 0,
       .max = 1000,
       .help = "KL penalty to the reference policy; 0 = no reference model"},
      {.path = "rl.max_new_tokens", .def = "16", .min = 1, .max = 1 << 20, .help = "longest completion"},
      {.path = "rl.temperature",
       .def = "1",
       .min = 0,
       .max = 100,
       .min_exclusive = true,
       .help = "sampling temperature"},
      {.path = "rl.top_p", .def = "1", .min = 0, .max = 1, .min_exclusive = true, .help = "nucleus sampling"},
      {.path = "rl.top_k", .min = 0, .max = kMaxVocab, .help = "0 = off"},
      {.path = "rl.epochs", .def = "1", .min = 1, .max = 1000, .help = "passes over each step's samples"},
      {.path = "rl.mini_batches",
       .def = "1",
       .min = 1,
       .max = 1 << 20,
       .help = "divides prompts_per_step x group_size / train workers"},
      {.path = "rl.scale_rewards", .def = "true", .zero_is_value = true, .help = "divide advantages by the group std"},
      {.path = "rl.loss_agg", .def = "token", .one_of = {"token", "sequence"}, .help = "loss averaged over"},
      {.path = "rl.stop_token_ids",
       .min = 0,
       .max = kMaxVocab,
       .max_len = 64,
       .help = "each < vocab_size (the model's eos ids from config.json, generation_config.json and the tokenizer "
               "always stop)"},
      {.path = "rl.stop",
       .max_len = 16,
       .help = "non-empty strings; with data: generation stops once the decoded response contains one, and the "
               "reward sees the text before it"},
      {.path = "rl.offload_optimizer", .help = "optimizer state to host memory during rollout"},
      {.path = "rl.shard_reference",
       .help = "KL reference policy partitioned across the ranks like the ZeRO-3 parameters and gathered unit by "
               "unit during LOGPROBS, instead of a full fp32 copy per rank (co-located mode)"},
      // rollout (grpo): the rollout engine.
      {.path = "rollout.kv_cache_bytes",
       .min = 0,
       .max = 1e15,
       .help = "KV cache budget per worker; 0 = room for every sequence of the step at full length (or "
               "rollout.kv_cache_fraction)"},
      {.path = "rollout.kv_cache_fraction",
       .min = 0,
       .max = 0.95,
       .help = "KV cache budget as a fraction of the worker's device memory (CUDA) or physical memory (CPU); "
               "0 = off; not with rollout.kv_cache_bytes"},
      {.path = "rollout.kv_dtype", .def = "fp32", .one_of = {"fp32", "bf16"}, .help = "KV cache element type"},
      {.path = "rollout.block_size", .def = "16", .min = 1, .max = 1024, .help = "positions per KV cache block"},
      {.path = "rollout.max_batch_tokens",
       .def = "2048",
       .min = 1,
       .max = 1 << 20,
       .help = "rows (decode tokens + prefill chunk tokens) per forward step"},
      {.path = "rollout.max_seqs", .def = "256", .min = 1, .max = 1 << 20, .help = "sequences running at once"},
      {.path = "rollout.no_prompt_sharing", .help = "prefill every sample's prompt on its own"},
      {.path = "rollout.min_p", .min = 0, .max = 0.99, .help = "keep tokens with p >= min_p * max p; 0 = off"},
      {.path = "rollout.repetition_penalty",
       .def = "1",
       .min = 0,
       .max = 100,
       .min_exclusive = true,
       .help = "CTRL penalty on tokens already seen; 1 = off"},
      {.path = "rollout.tp_size",
       .def = "1",
       .min = 1,
       .max = 1024,
       .help = "tensor-parallel rollout: groups of tp_size consecutive workers (disaggregated: rollout workers) "
               "split attention heads and MLP columns; divides those workers and the model's attention heads, "
               "key/value heads and intermediate_size; a degraded continuation rolls out at tp_size 1"},
      {.path = "rollout.tp_overlap",
       .def = "true",
       .zero_is_value = true,
       .help = "tp_size > 1: each forward's tokens in two halves, one half's all-reduce overlapping the other's "
               "compute"},
      {.path = "rollout.shift_parallel",
       .help = "tp_size > 1: forward steps of at least shift_threshold_tokens rows run sequence-parallel (each "
               "rank its share of the rows with the full weights, attention by all-to-all over the same KV "
               "cache; costs a full copy of the weights per rank), smaller steps tensor-parallel"},
      {.path = "rollout.shift_threshold_tokens",
       .def = "256",
       .min = 1,
       .max = 1 << 20,
       .help = "shift_parallel: rows (prefill + decode tokens) from which a step runs sequence-parallel"},
      {.path = "rollout.sparse.top_k_blocks",
       .min = 0,
       .max = 1 << 20,
       .help = "top-k block-sparse attention in full-attention layers: each token attends exactly to the sink "
               "blocks, the recent blocks and the top_k_blocks other blocks of its sequence whose key max/min "
               "bound its scores highest (HiP / Quest); 0 = off (dense)"},
      {.path = "rollout.sparse.block_size",
       .def = "64",
       .min = 1,
       .max = 1 << 16,
       .help = "sparse attention: positions per block; a multiple of rollout.block_size"},
      {.path = "rollout.sparse.sink_blocks",
       .def = "1",
       .zero_is_value = true,
       .min = 0,
       .max = 1 << 20,
       .help = "sparse attention: first blocks of a sequence, always attended"},
      {.path = "rollout.sparse.recent_blocks",
       .def = "2",
       .min = 1,
       .max = 1 << 20,
       .help = "sparse attention: last blocks (the token's own included), always attended"},
      // init (grpo): SFT warm start.
      {.path = "init.sft_steps", .min = 0, .max = kMaxSteps, .help = "SFT warm-start steps before RL"},
      {.path = "init.sft_lr", .def_from = "train.lr", .min = 0, .max = 10, .help = "warm-start learning rate"},
      {.path = "init.sft_stop_accuracy",
       .min = 0,
       .max = 1,
       .help = "0 = off; needs sft.steps: the warm start ends once this fraction of a fixed probe is exact "
               "under teacher forcing (below)"},
      // placement (grpo).
      {.path = "placement.mode",
       .def = "colocated",
       .one_of = {"colocated", "disaggregated"},
       .help = "disaggregated: separate rollout and train workers"},
      {.path = "placement.rollout_workers",
       .min = 0,
       .max = kMaxWorkers,
       .help = "disaggregated: >= 1, rollout_workers + train_workers = cluster.workers"},
      {.path = "placement.train_workers", .min = 0, .max = kMaxWorkers, .help = "disaggregated: >= 1"},
      {.path = "placement.coupling", .def = "sync", .one_of = {"sync", "async"}, .help = "disaggregated"},
      {.path = "placement.max_staleness",
       .def = "1",
       .zero_is_value = true,
       .min = 0,
       .max = 1000,
       .help = "policy versions (async)"},
      // cluster.
      {.path = "cluster.workers", .def = "1", .min = 1, .max = kMaxWorkers, .help = "gang: all start together"},
      {.path = "cluster.device",
       .def = "cpu",
       .min = 1,
       .help = "cuda runs only on workers started with device cuda; model, ZeRO state and KV cache in GPU "
               "memory, NCCL (docs/gpu.md)"},
      {.path = "cluster.zero_stage", .min = 0, .max = 3, .help = "ZeRO stage (docs/parallelism.md)"},
      {.path = "cluster.min_workers",
       .def_from = "cluster.workers",
       .min = 0,
       .max = kMaxWorkers,
       .help = "<= workers (elastic continuation)"},
      {.path = "cluster.threads_per_worker", .min = 0, .max = 1024, .help = "0 = the worker's setting"},
      {.path = "cluster.sequence_parallel",
       .def = "1",
       .min = 1,
       .max = kMaxWorkers,
       .help = "sft: ranks that split each sequence (divides workers; data-parallel groups = workers / N; "
               "any zero_stage, cpu; docs/parallelism.md)"},
      {.path = "cluster.shard_by_speed",
       .help = "each rank's share of every batch and of the ZeRO partition proportional to its worker's speed "
               "(tandem-worker --speed, else a calibration at setup; docs/parallelism.md)"},
      // checkpoint.
      {.path = "checkpoint.every", .min = 0, .max = kMaxSteps, .help = "0 = never; else every N steps"},
      {.path = "checkpoint.keep", .def = "3", .min = 1, .max = 1000, .help = "newest kept"},
      {.path = "checkpoint.dir", .doc_default = "`<runs_dir>/<job id>/checkpoints`", .help = "where they go"},
      // recovery: zero takes the coordinator's setting.
      {.path = "recovery.replacement_timeout_ms",
       .doc_default = "coordinator's",
       .min = 0,
       .max = 86400000,
       .help = "wait this long for a replacement worker"},
      {.path = "recovery.max_recoveries",
       .doc_default = "coordinator's",
       .min = 0,
       .max = 10000,
       .help = "then the job fails"},
      {.path = "recovery.no_peer_copies", .help = "no in-memory neighbour copies (disk restores only)"},
      {.path = "recovery.degraded",
       .help = "degraded continuation (colocated, workers >= 2): survivors take over a lost rank's shares "
               "at once (docs/reliability.md)"},
      {.path = "recovery.degraded_cheap_backward",
       .help = "with degraded: taken-over shares skip the attention backward"},
      {.path = "recovery.degraded_low_rank",
       .min = 0,
       .max = 65536,
       .help = "with degraded: R > 0 computes the taken-over MLP weight gradients through a rank-R projection"},
  };
  o.aliases["model.config.rope_scaling"] = {{"type", "rope_type"}};
  // Keys of HF config.json files that carry no information for us.
  o.ignored["model.config"] = {"architectures",     "torch_dtype",        "transformers_version",
                               "use_cache",         "initializer_range",  "hidden_act",
                               "attention_dropout", "use_sliding_window", "max_window_layers",
                               "pretraining_tp",    "mlp_bias",           "_name_or_path"};
  o.virtual_maps["init"] = {
      {"sft", {{"steps", "sft_steps"}, {"lr", "sft_lr"}, {"stop_accuracy", "sft_stop_accuracy"}}}};
  FinishConfigTable(*t);
  return t;
}

}  // namespace

const ConfigTable& JobSpecTable() {
  static const ConfigTable* table = MakeJobSpecTable();
  return *table;
}

}  // namespace tandem::common
