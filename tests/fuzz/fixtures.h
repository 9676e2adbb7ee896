// Fixed data some fuzz targets run against, shared with make_seeds.cc,
// which writes part of the seed corpus from it: the tiny model of the
// safetensors target, the shard files of the checkpoint manifest target and
// the job of the RPC target. Changing them invalidates those seeds: rerun
// make_seeds (README.md).
#ifndef TANDEM_TESTS_FUZZ_FIXTURES_H_
#define TANDEM_TESTS_FUZZ_FIXTURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/ckpt/checkpoint.h"
#include "worker/model/config.h"

namespace tandem::fuzz {

// About 250 floats with every tensor kind: q/k/v biases (qwen2), untied
// embeddings, grouped-query attention.
inline model::ModelConfig TinyModelConfig() {
  model::ModelConfig c;
  c.model_type = "qwen2";
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 16;
  return c;
}

// Where the RPC target's seeded jobs say their runs live (never created:
// the coordinator only compares reported paths with it).
inline constexpr char kFixtureRunsDir[] = "/tandem-fuzz/runs";

// A small valid job file (every job the RPC target seeds its state with).
inline constexpr char kFixtureJobYaml[] = R"(name: fuzz
kind: sft
model:
  config: {vocab_size: 99, hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1,
           num_attention_heads: 2, max_position_embeddings: 32, tokenizer: char}
task: {name: arithmetic}
train: {steps: 4, global_batch: 2, micro_batch: 1, seq_len: 16}
cluster: {workers: 1, device: cpu}
checkpoint: {every: 2}
)";

inline constexpr uint64_t kFixtureTotalFloats = 8;

// Two checkpoints' shards over 8 floats, all in one directory: world size
// 2 (rank 0 holds [0,3) and [6,8), rank 1 holds [3,6); arrays params and
// exp_avg) and world size 1 (rank 0 holds everything; params only).
inline std::vector<std::pair<int, ckpt::ShardState>> FixtureShards() {
  auto shard = [](int rank, std::vector<ckpt::Range> ranges, std::vector<std::string> arrays) {
    ckpt::ShardState s;
    s.rank = rank;
    s.ranges = std::move(ranges);
    for (const std::string& name : arrays) {
      std::vector<float> values;
      for (const ckpt::Range& r : s.ranges) {
        for (uint64_t i = r.offset; i < r.offset + r.count; ++i) values.push_back(static_cast<float>(i) + 0.5f);
      }
      s.arrays.emplace_back(name, std::move(values));
    }
    return s;
  };
  return {{2, shard(0, {{0, 3}, {6, 2}}, {"params", "exp_avg"})},
          {2, shard(1, {{3, 3}}, {"params", "exp_avg"})},
          {1, shard(0, {{0, 8}}, {"params"})}};
}

// Writes FixtureShards() into dir; returns each one's {world size, info}.
inline std::vector<std::pair<int, ckpt::ShardFileInfo>> WriteFixtureShards(const std::string& dir) {
  std::vector<std::pair<int, ckpt::ShardFileInfo>> out;
  for (const auto& [world, state] : FixtureShards()) {
    auto info = ckpt::WriteShard(dir, world, state);
    if (!info.ok()) return {};
    out.emplace_back(world, *info);
  }
  return out;
}

}  // namespace tandem::fuzz

#endif  // TANDEM_TESTS_FUZZ_FIXTURES_H_
