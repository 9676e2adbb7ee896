// The rollout cases of bench_model (config A, CPU): KV-cache decoding
// (batch 16, prompt 128, 128 new tokens) and a GRPO-shaped rollout (64
// prompts x G = 8, prompt lengths 32-256, response lengths from a seeded
// geometric table capped at 256, forced by a stop check), each with the
// rollout engine (worker/rollout/engine.h) in its static-batch mode (the
// whole batch prefilled at once, no prompt sharing, nothing admitted until
// it drains) and in its continuous-batching mode, in the same run.
#pragma once

#include <string>

#include "kernels/ops.h"
#include "worker/model/config.h"

namespace tandem::bench {

void DecodeCase(const model::ModelConfig& config, kernels::Ops* ops, int repeats);
// table_out: when not empty, the prompt and response lengths are written
// there as JSON for bench/pytorch/llama_peer.py --grpo-table.
void GrpoCase(const model::ModelConfig& config, kernels::Ops* ops, int repeats, const std::string& table_out);

}  // namespace tandem::bench
