// RolloutEngine: greedy tokens equal recomputing the full forward at every
// step; the same tokens for any batch composition, KV budget (preemption
// and recomputation) and with or without shared prompts; bf16 KV; stop ids
// and stop checks; bounded memory with nothing kept between calls; sampling
// with every filter on the backend follows the host sampler.
#include "worker/rollout/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "tests/rollout/engine_test_util.h"
#include "tests/rollout/tp_test_util.h"
#include "worker/model/config.h"
#include "worker/model/model.h"

namespace tandem::rollout {
namespace {

using model::ModelConfig;

// The shared test models (llama, qwen, qwen3, mistral): tests/rollout/tp_test_util.h.
using tptest::Config;

// A test model of one kind with its random weights.
struct Fixture : enginetest::ModelFixture {
  Fixture(const std::string& kind, kernels::Ops* ops) : ModelFixture(Config(kind), ops, 11 + kind.size()) {}
};

using enginetest::ExpectGreedyMatchesFullForward;
using enginetest::FullForwardLogits;
using enginetest::Tokens;
using tptest::Requests;  // groups of G samples of 4 prompts (lengths 1..11)

RolloutOptions Small() { return tptest::Small(/*greedy=*/true); }

TEST(RolloutEngineTest, GreedyMatchesFullForwardReference) {
  auto ops = kernels::MakeReferenceOps();
  for (const char* kind : {"llama", "qwen", "qwen3", "mistral", "hybrid"}) {
    SCOPED_TRACE(kind);
    Fixture f(kind, ops.get());
    ExpectGreedyMatchesFullForward(f, Small());
  }
}

TEST(RolloutEngineTest, GreedyMatchesFullForwardCpu) {
  auto ops = kernels::MakeCpuOps(0);
  for (const char* kind : {"llama", "qwen", "qwen3", "hybrid"}) {
    SCOPED_TRACE(kind);
    Fixture f(kind, ops.get());
    ExpectGreedyMatchesFullForward(f, Small());
  }
}

RolloutOptions Sampled() {
  RolloutOptions o = Small();
  o.sampling.greedy = false;
  o.sampling.temperature = 0.9f;
  o.sampling.top_k = 12;
  o.sampling.top_p = 0.95f;
  o.sampling.min_p = 0.02f;
  o.sampling.seed = 42;
  return o;
}

// The reference backend computes each row alone, so tokens compare exactly.
TEST(RolloutEngineTest, SameTokensForAnyBatchCompositionBudgetOrSharing) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("qwen", ops.get());
  for (const RolloutOptions& base : {Small(), Sampled()}) {
    RolloutEngine eng(f.config, f.ops);
    const auto reqs = Requests(3);
    auto all = eng.Generate(reqs, base, *f.pp);
    ASSERT_TRUE(all.ok()) << all.status();
    const auto want = Tokens(*all);
    // One at a time, and in reverse order.
    for (size_t s = 0; s < reqs.size(); ++s) {
      auto one = eng.Generate({reqs[s]}, base, *f.pp);
      ASSERT_TRUE(one.ok());
      EXPECT_EQ(one->sequences[0].tokens, want[s]) << "sequence " << s;
    }
    std::vector<RolloutRequest> rev(reqs.rbegin(), reqs.rend());
    auto r = eng.Generate(rev, base, *f.pp);
    ASSERT_TRUE(r.ok());
    for (size_t s = 0; s < reqs.size(); ++s) EXPECT_EQ(r->sequences[reqs.size() - 1 - s].tokens, want[s]);
    // No prompt sharing; one running sequence; a large token budget; two
    // running sequences (a group's third sample starts later, forking a
    // running sibling's prompt and recomputing its last position).
    for (int variant = 0; variant < 4; ++variant) {
      RolloutOptions o = base;
      if (variant == 0) o.share_prompts = false;
      if (variant == 1) o.max_seqs = 1;
      if (variant == 2) o.max_batch_tokens = 4096;
      if (variant == 3) o.max_seqs = 2;
      auto v = eng.Generate(reqs, o, *f.pp);
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(Tokens(*v), want) << "variant " << variant;
      if (variant == 0) {
        EXPECT_EQ(v->scheduler.prompt_tokens_saved, 0);
      }
    }
    // Prompt sharing saved (G - 1) prefills of every prompt: 2 x (4+2+11+1).
    EXPECT_EQ(all->scheduler.prompt_tokens_saved, 2 * 18);
  }
}

TEST(RolloutEngineTest, LateSamplesForkARunningSiblingsPromptWithSameTokens) {
  // One group of 5 samples whose lengths differ (forced by a stop check),
  // 2 running at once: the later samples join while a sibling still runs,
  // fork its prompt blocks and recompute only the prompt's last position.
  // Their tokens equal those of all samples at once and of no sharing.
  auto ops = kernels::MakeReferenceOps();
  ModelConfig config = Config("llama");
  config.eos_token_ids = {};  // the stop check alone ends the samples
  enginetest::ModelFixture f(config, ops.get(), 15);
  RolloutEngine eng(f.config, f.ops);
  const std::vector<int32_t> prompt = {3, 9, 4, 1, 7, 2, 8};
  const std::vector<int> lengths = {10, 1, 3, 2, 4};
  std::vector<RolloutRequest> reqs;
  for (int g = 0; g < 5; ++g) reqs.push_back({prompt, 0, static_cast<uint64_t>(g)});
  for (bool greedy : {true, false}) {
    auto run = [&](int max_seqs, bool share) {
      RolloutOptions o = greedy ? Small() : Sampled();
      o.max_seqs = max_seqs;
      o.share_prompts = share;
      std::vector<int> count(reqs.size(), 0);
      o.stop_check = [&](size_t i, int32_t) { return ++count[i] >= lengths[i]; };
      auto r = eng.Generate(reqs, o, *f.pp);
      EXPECT_TRUE(r.ok()) << r.status();
      return *r;
    };
    const RolloutResult all = run(8, true), late = run(2, true), unshared = run(2, false);
    EXPECT_EQ(Tokens(late), Tokens(all)) << "greedy " << greedy;
    EXPECT_EQ(Tokens(unshared), Tokens(all)) << "greedy " << greedy;
    for (size_t s = 0; s < reqs.size(); ++s) EXPECT_EQ(late.sequences[s].tokens.size(), size_t(lengths[s]));
    // One prefill of 7 rows, then one row for each of the 3 late samples.
    EXPECT_EQ(late.scheduler.prefill_tokens, 7 + 3);
    EXPECT_EQ(late.scheduler.prompt_tokens_saved, 7 + 3 * 6);
    EXPECT_EQ(unshared.scheduler.prefill_tokens, 5 * 7);
  }
}

TEST(RolloutEngineTest, TinyKvBudgetPreemptsAndRecomputesWithSameTokens) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("llama", ops.get());
  const RolloutOptions base = Sampled();
  RolloutEngine eng(f.config, f.ops);
  const auto reqs = Requests(3);
  auto big = eng.Generate(reqs, base, *f.pp);
  ASSERT_TRUE(big.ok());
  RolloutOptions tiny = base;
  // 7 blocks of 4: the longest sequence (11 + 10 positions) needs 6.
  tiny.kv_cache_bytes = 7 * KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32);
  auto small = eng.Generate(reqs, tiny, *f.pp);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->num_blocks, 7);
  EXPECT_GT(small->scheduler.preemptions, 0);
  EXPECT_GT(small->scheduler.recomputed_tokens, 0);
  EXPECT_LE(small->kv_peak_bytes, tiny.kv_cache_bytes);
  EXPECT_EQ(Tokens(*small), Tokens(*big));
  // Smaller than one sequence: a clear error naming the option.
  tiny.kv_cache_bytes = 2 * KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32);
  auto none = eng.Generate(reqs, tiny, *f.pp);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("rollout.kv_cache_bytes"), std::string::npos);
}

// Two groups of 4 samples of 12-token prompts (3 blocks of 4): under a
// 12-block budget the newest samples are preempted while older siblings
// still run, and come back forking the group's prompt blocks again.
TEST(RolloutEngineTest, PreemptedSamplesReshareTheirGroupsPrompt) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("llama", ops.get());
  RolloutOptions base = Sampled();
  base.max_new_tokens = 12;
  base.max_batch_tokens = 64;
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 13, 4, 6, 8, 10, 12, 14, 16, 18},
                                                     {1, 20, 3, 7, 11, 15, 19, 23, 27, 25, 21, 17}};
  std::vector<RolloutRequest> reqs;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int g = 0; g < 4; ++g) reqs.push_back({prompts[p], static_cast<int>(p), p * 4 + g});
  }
  RolloutEngine eng(f.config, f.ops);
  auto big = eng.Generate(reqs, base, *f.pp);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->scheduler.preemptions, 0);
  EXPECT_EQ(big->scheduler.prompt_tokens_saved, 2 * 3 * 12);
  RolloutOptions tiny = base;
  tiny.kv_cache_bytes = 12 * KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32);
  auto small = eng.Generate(reqs, tiny, *f.pp);
  ASSERT_TRUE(small.ok()) << small.status();
  std::printf("[reshare] preemptions %lld, prompt tokens saved %lld (no preemption: %lld), recomputed %lld\n",
              static_cast<long long>(small->scheduler.preemptions),
              static_cast<long long>(small->scheduler.prompt_tokens_saved),
              static_cast<long long>(big->scheduler.prompt_tokens_saved),
              static_cast<long long>(small->scheduler.recomputed_tokens));
  EXPECT_GT(small->scheduler.preemptions, 0);
  EXPECT_EQ(Tokens(*small), Tokens(*big));
  // A preempted sample that comes back while a sibling still runs forks the
  // group's prompt again (counted as saved); one whose siblings were all
  // preempted too prefills it again. Prompts are complete within one step
  // here, so each preemption is one or the other.
  EXPECT_GT(small->scheduler.prompt_tokens_saved, big->scheduler.prompt_tokens_saved);
  EXPECT_EQ(small->scheduler.prompt_tokens_saved + small->scheduler.prefill_tokens,
            big->scheduler.prompt_tokens_saved + big->scheduler.prefill_tokens + 12 * small->scheduler.preemptions);
  EXPECT_LE(small->kv_peak_bytes, tiny.kv_cache_bytes);
  // Without sharing nothing is saved, preempted or not; same tokens.
  tiny.share_prompts = false;
  auto unshared = eng.Generate(reqs, tiny, *f.pp);
  ASSERT_TRUE(unshared.ok()) << unshared.status();
  EXPECT_EQ(unshared->scheduler.prompt_tokens_saved, 0);
  EXPECT_EQ(Tokens(*unshared), Tokens(*big));
}

// A model whose every KV layer is windowed: a 51-position sequence runs in
// `blocks` blocks of 4 (13 unwindowed) with the greedy tokens of the full
// forward; a cache of `least` blocks (what one row per step needs) runs a
// whole sampled batch with preemptions and the default cache's tokens; one
// block fewer is refused by name.
void ExpectWindowedCacheBounded(const std::string& kind, int blocks, int least) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f(kind, ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  o.max_new_tokens = 40;
  const std::vector<RolloutRequest> one = {{{1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22}, 0, 0}};
  auto r = eng.Generate(one, o, *f.pp);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t block = KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32);
  EXPECT_EQ(r->num_blocks, blocks);
  EXPECT_LE(r->kv_peak_bytes, blocks * block);
  enginetest::ExpectGreedyTokensOfFullForward(f, one, *r);
  RolloutOptions sampled = Sampled();
  sampled.max_new_tokens = 24;
  const auto reqs = Requests(3);
  auto big = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_TRUE(big.ok()) << big.status();
  sampled.kv_cache_bytes = least * block;
  auto tiny = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->num_blocks, least);
  EXPECT_GT(tiny->scheduler.preemptions, 0);
  EXPECT_EQ(Tokens(*tiny), Tokens(*big));
  sampled.kv_cache_bytes = (least - 1) * block;
  auto none = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("rollout.kv_cache_bytes"), std::string::npos) << none.status();
}

// Mistral's window of 4 on every layer: (4 - 1 + 7) / 4 + 2 = 4 blocks; the
// window and the next row need 2.
TEST(RolloutEngineTest, SlidingWindowLayersGiveBlocksBack) { ExpectWindowedCacheBounded("mistral", 4, 2); }

// Windows of 4 with up to 5 attention sinks: the 2 blocks that hold the
// sinks stay as well, 2 + 4 = 6 blocks; the least cache is 2 + 2.
TEST(RolloutEngineTest, SinkLayersKeepTheirSinkBlocksAndGiveTheRestBack) { ExpectWindowedCacheBounded("sinks", 6, 4); }

// Windowed layers beside a full one keep their own block pool and give
// its blocks back behind the window: a 51-position sequence holds 13 blocks
// of 4 in the full layer's pool and at most 5 (its sink block, the window
// and one step's rows) in the two windowed layers' pool, with the greedy
// tokens of the full forward. A sampled batch with shared prompts (forked
// and copied on write in both pools) gets the same tokens without sharing
// and under the least budget (9 + 3 blocks: preemptions); a byte less is
// refused by name.
TEST(RolloutEngineTest, WindowedLayersBesideFullOnesGiveTheirBlocksBack) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("hybrid", ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  o.max_new_tokens = 40;
  const std::vector<RolloutRequest> one = {{{1, 3, 4, 7, 8, 11, 12, 17, 19, 21, 22}, 0, 0}};
  auto r = eng.Generate(one, o, *f.pp);
  ASSERT_TRUE(r.ok()) << r.status();
  const size_t full_block = KvPool::BlockBytes(1, 2 * 8, 4, kernels::KvDtype::kF32);
  const size_t windowed_block = KvPool::BlockBytes(2, 2 * 8, 4, kernels::KvDtype::kF32);
  EXPECT_EQ(r->num_blocks, 13);
  EXPECT_EQ(r->windowed_blocks, 1 + (4 - 1 + 7) / 4 + 2);
  EXPECT_EQ(r->kv_pool_bytes, 13 * full_block + 5 * windowed_block);
  EXPECT_LE(r->kv_peak_bytes, r->kv_pool_bytes);
  // One pool for all three layers would hold 13 blocks of each.
  EXPECT_LT(r->kv_pool_bytes, 13 * KvPool::BlockBytes(3, 2 * 8, 4, kernels::KvDtype::kF32));
  enginetest::ExpectGreedyTokensOfFullForward(f, one, *r);

  RolloutOptions sampled = Sampled();
  sampled.max_new_tokens = 24;
  const auto reqs = Requests(3);
  auto big = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GT(big->scheduler.cow_copies, 0);
  EXPECT_GT(big->scheduler.prompt_tokens_saved, 0);
  RolloutOptions unshared = sampled;
  unshared.share_prompts = false;
  auto alone = eng.Generate(reqs, unshared, *f.pp);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(Tokens(*alone), Tokens(*big));
  // Two running at once: late samples of the 2- and 4-token prompts fork a
  // running sibling's prompt (its window lies in the kept sink block).
  RolloutOptions two = sampled;
  two.max_seqs = 2;
  auto late = eng.Generate(reqs, two, *f.pp);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_GT(late->scheduler.prompt_tokens_saved, 0);
  EXPECT_EQ(Tokens(*late), Tokens(*big));
  // The longest sequence: 11 + 24 positions, 9 blocks; 3 windowed ones.
  sampled.kv_cache_bytes = 9 * full_block + 3 * windowed_block;
  auto tiny = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->num_blocks, 9);
  EXPECT_EQ(tiny->windowed_blocks, 3);
  EXPECT_GT(tiny->scheduler.preemptions, 0);
  EXPECT_LE(tiny->kv_peak_bytes, sampled.kv_cache_bytes);
  EXPECT_EQ(Tokens(*tiny), Tokens(*big));
  sampled.kv_cache_bytes -= 1;
  auto none = eng.Generate(reqs, sampled, *f.pp);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("rollout.kv_cache_bytes"), std::string::npos) << none.status();
}

TEST(RolloutEngineTest, StaticBatchModeHasTheSameTokens) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("qwen", ops.get());
  RolloutEngine eng(f.config, f.ops);
  const auto reqs = Requests(3);
  auto cont = eng.Generate(reqs, Sampled(), *f.pp);
  ASSERT_TRUE(cont.ok());
  RolloutOptions o = Sampled();
  o.static_batch = true;
  o.max_seqs = 4;  // batches of 4, each drained before the next
  auto stat = eng.Generate(reqs, o, *f.pp);
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_EQ(Tokens(*stat), Tokens(*cont));
  EXPECT_LE(stat->scheduler.max_running, 4);
  EXPECT_GT(stat->scheduler.steps, cont->scheduler.steps);
  EXPECT_GT(cont->prefill_seconds + cont->decode_seconds, 0);
}

TEST(RolloutEngineTest, Bf16KvCacheIsCloseToFp32AndHalfTheBytes) {
  auto ops = kernels::MakeCpuOps(0);
  Fixture f("llama", ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  auto fp32 = eng.Generate(Requests(1), o, *f.pp);
  ASSERT_TRUE(fp32.ok());
  o.kv_dtype = kernels::KvDtype::kBF16;
  auto bf16 = eng.Generate(Requests(1), o, *f.pp);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->kv_pool_bytes * 2, fp32->kv_pool_bytes);
  for (size_t s = 0; s < fp32->sequences.size(); ++s) {
    // The first token comes from the prompt's cache alone.
    EXPECT_EQ(bf16->sequences[s].tokens[0], fp32->sequences[s].tokens[0]);
    EXPECT_NEAR(bf16->sequences[s].raw_logprobs[0], fp32->sequences[s].raw_logprobs[0], 0.05);
  }
}

TEST(RolloutEngineTest, StopIdsAndStopChecksEndSequences) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("llama", ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  auto free_run = eng.Generate(Requests(1), o, *f.pp);
  ASSERT_TRUE(free_run.ok());
  const int32_t stop = free_run->sequences[0].tokens[3];
  o.stop_ids = {stop};
  o.stop_check = [](size_t seq, int32_t) { return seq == 1; };  // after one token
  auto r = eng.Generate(Requests(1), o, *f.pp);
  ASSERT_TRUE(r.ok());
  const auto& s0 = r->sequences[0];
  ASSERT_LE(s0.tokens.size(), 4u);
  EXPECT_EQ(s0.tokens.back(), stop);
  EXPECT_EQ(s0.finish, Finish::kStop);
  EXPECT_EQ(r->sequences[1].tokens.size(), 1u);
  EXPECT_EQ(r->sequences[1].finish, Finish::kStop);
  EXPECT_EQ(r->sequences[2].finish == Finish::kLength, r->sequences[2].tokens.size() == 10u);
}

TEST(RolloutEngineTest, MemoryIsBoundedAndNotKeptBetweenCalls) {
  auto ops = kernels::MakeCpuOps(0);
  Fixture f("llama", ops.get());
  RolloutEngine eng(f.config, f.ops);
  auto a = eng.Generate(Requests(2), Sampled(), *f.pp);
  ASSERT_TRUE(a.ok());
  const size_t held = eng.held_bytes();
  for (int i = 0; i < 3; ++i) {
    auto b = eng.Generate(Requests(2), Sampled(), *f.pp);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(eng.held_bytes(), held);
    EXPECT_LE(b->kv_peak_bytes, b->kv_pool_bytes);
  }
  eng.Release();
  EXPECT_EQ(eng.held_bytes(), 0u);
}

TEST(RolloutEngineTest, BadOptionsAreRejectedByName) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("llama", ops.get());
  RolloutEngine eng(f.config, f.ops);
  struct Bad {
    const char* want;
    std::function<void(RolloutOptions&)> set;
  };
  const Bad bad[] = {
      {"temperature",
       [](RolloutOptions& o) {
         o.sampling.greedy = false;
         o.sampling.temperature = 0;
       }},
      {"top_p", [](RolloutOptions& o) { o.sampling.top_p = 0; }},
      {"min_p", [](RolloutOptions& o) { o.sampling.min_p = 1; }},
      {"repetition_penalty", [](RolloutOptions& o) { o.sampling.repetition_penalty = 0; }},
      {"rollout.block_size", [](RolloutOptions& o) { o.block_size = 0; }},
      {"rollout.max_batch_tokens", [](RolloutOptions& o) { o.max_batch_tokens = 0; }},
      {"rollout.max_seqs", [](RolloutOptions& o) { o.max_seqs = 0; }},
  };
  for (const Bad& b : bad) {
    RolloutOptions o = Small();
    b.set(o);
    auto r = eng.Generate(Requests(1), o, *f.pp);
    ASSERT_FALSE(r.ok()) << b.want;
    EXPECT_NE(r.status().message().find(b.want), std::string::npos) << r.status();
  }
  auto r = eng.Generate({{{1, 99}, -1, 0}}, Small(), *f.pp);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside"), std::string::npos);
}

double u_of(const RolloutOptions& o, const RolloutRequest& r, size_t token_index) {
  return StreamUniform(o.sampling.seed, r.stream, token_index);
}

// Every sampled token with every filter on (Ops::sample_filtered) is the
// host sampler's pick from the full forward's logits at that position, with
// the sequence's own uniform and seen tokens (prompt and generated).
TEST(RolloutEngineTest, FilteredSamplingFollowsTheHostSampler) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("qwen", ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Sampled();
  o.sampling.repetition_penalty = 1.4f;
  const auto reqs = Requests(2);
  auto res = eng.Generate(reqs, o, *f.pp);
  ASSERT_TRUE(res.ok()) << res.status();
  const int V = f.config.vocab_size;
  HostSampler host;
  int checked = 0;
  for (size_t s = 0; s < reqs.size(); ++s) {
    const auto& g = res->sequences[s];
    std::vector<int32_t> seq = reqs[s].prompt;
    seq.insert(seq.end(), g.tokens.begin(), g.tokens.end());
    std::vector<float> logits;
    ASSERT_TRUE(FullForwardLogits(f, seq, &logits));
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      const size_t at = reqs[s].prompt.size() - 1 + j;
      const std::span<const int32_t> seen(seq.data(), at + 1);
      const Pick p = host.Sample(logits.data() + at * V, V, o.sampling, u_of(o, reqs[s], j), seen);
      EXPECT_EQ(g.tokens[j], p.token) << "sequence " << s << " token " << j;
      EXPECT_NEAR(g.logprobs[j], p.logprob, 1e-4) << "sequence " << s << " token " << j;
      EXPECT_NEAR(g.raw_logprobs[j], p.raw_logprob, 1e-4) << "sequence " << s << " token " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(RolloutEngineTest, RepetitionPenaltyAvoidsSeenTokens) {
  auto ops = kernels::MakeReferenceOps();
  Fixture f("llama", ops.get());
  RolloutEngine eng(f.config, f.ops);
  RolloutOptions o = Small();
  o.sampling.repetition_penalty = 1e6f;
  o.max_new_tokens = 5;
  auto r = eng.Generate(Requests(1), o, *f.pp);
  ASSERT_TRUE(r.ok());
  // Every token is new to its sequence (the vocabulary of 29 is large enough).
  for (size_t s = 0; s < r->sequences.size(); ++s) {
    std::vector<int32_t> seen = Requests(1)[s].prompt;
    for (int32_t t : r->sequences[s].tokens) {
      EXPECT_EQ(std::find(seen.begin(), seen.end(), t), seen.end());
      seen.push_back(t);
    }
  }
}

}  // namespace
}  // namespace tandem::rollout
