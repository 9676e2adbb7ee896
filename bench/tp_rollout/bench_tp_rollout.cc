// bench_tp_rollout: rollout decode throughput under tensor parallelism and
// the share of all-reduce time the two-half overlap hides.
//
//   bench_tp_rollout [--hidden 1024] [--heads 16] [--kv-heads 8]
//                    [--inter 2816] [--layers 4] [--vocab 4096]
//                    [--seqs 16] [--prompt 16] [--new 32] [--repeats 2]
//                    [--group 1] [--shift 0]
//
// A random Llama-style model; --seqs greedy sequences of --prompt tokens
// generate --new tokens each (one prefill step, then decode steps of --seqs
// rows). Cases: TP=1 (one rank, one core), TP=2 (two ranks as two threads
// of this process, one core each, Gloo over 127.0.0.1) unsplit, and TP=2
// with the two-half overlap. Per case, the best of --repeats runs: tokens/s
// (generated tokens over the Generate wall time, slowest rank), all-reduce
// time and calls, the time the compute waited for them, and the hidden
// share = 1 - waited / all-reduce time. Every TP=2 case checks that its
// tokens equal TP=1's. Last, the switch into the rollout: two ranks holding
// ZeRO shards of the model gather their TP=2 slices (GatherTpSlice), bytes
// received vs what a full gather brings to each rank.
//
// --group G: the sequences come in groups of G with the same prompt (a GRPO
// step's samples; the engine prefills each prompt once). --shift N > 0 adds
// the case TP=2 with shift parallelism (steps of at least N rows run
// sequence-parallel, the others tensor-parallel with the overlap), its
// steps and rows per mode, and the full weights it keeps beside the slice.
// Every case also reports its prefill and decode step time.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/tp_decoder.h"
#include "worker/rollout/tp_gather.h"
#include "worker/rollout/tp_slice.h"

namespace {

using namespace tandem;

struct Flags {
  int hidden = 1024, heads = 16, kv_heads = 8, inter = 2816, layers = 4, vocab = 4096;
  int seqs = 16, prompt = 16, new_tokens = 32, repeats = 2, group = 1, shift = 0;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--hidden") f.hidden = v;
    else if (k == "--heads") f.heads = v;
    else if (k == "--kv-heads") f.kv_heads = v;
    else if (k == "--inter") f.inter = v;
    else if (k == "--layers") f.layers = v;
    else if (k == "--vocab") f.vocab = v;
    else if (k == "--seqs") f.seqs = v;
    else if (k == "--prompt") f.prompt = v;
    else if (k == "--new") f.new_tokens = v;
    else if (k == "--repeats") f.repeats = v;
    else if (k == "--group") f.group = std::max(v, 1);
    else if (k == "--shift") f.shift = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      std::exit(2);
    }
  }
  return f;
}

struct CaseResult {
  double seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  int64_t tokens = 0;
  size_t full_copy_bytes = 0, slice_bytes = 0;
  rollout::TpStats stats;
  std::vector<std::vector<int32_t>> out;
};

std::vector<rollout::RolloutRequest> Requests(const Flags& f) {
  std::vector<rollout::RolloutRequest> r;
  std::mt19937 rng(1);
  for (int s = 0; s < f.seqs; ++s) {
    rollout::RolloutRequest q;
    if (s % f.group == 0) {
      for (int i = 0; i < f.prompt; ++i) q.prompt.push_back(static_cast<int32_t>(rng() % f.vocab));
    } else {
      q.prompt = r.back().prompt;
    }
    q.group = f.group > 1 ? s / f.group : -1;
    q.stream = s;
    r.push_back(q);
  }
  return r;
}

rollout::RolloutOptions Options(const Flags& f) {
  rollout::RolloutOptions o;
  o.sampling.greedy = true;
  o.max_new_tokens = f.new_tokens;
  o.max_batch_tokens = f.seqs * f.prompt;
  o.max_seqs = f.seqs;
  o.block_size = 16;
  return o;
}

// One rank's Generate; returns false (after printing why) on an error.
bool RunRank(const model::ModelConfig& config, const std::vector<float>& full, comm::Collective* group, int tp,
             bool overlap, int shift, const Flags& f, CaseResult* out) {
  auto ops = kernels::MakeCpuOps(1);
  const int rank = group == nullptr ? 0 : group->rank();
  auto map = rollout::MakeTpSliceMap(config, rank, tp);
  if (!map.ok()) {
    std::fprintf(stderr, "%s\n", map.status().ToString().c_str());
    return false;
  }
  std::vector<float> slice(map->slice_floats);
  rollout::SliceFromFull(*map, full.data(), slice.data());
  rollout::TpOptions tpo;
  tpo.overlap = overlap;
  tpo.shift = shift > 0;
  tpo.shift_threshold_tokens = std::max(shift, 1);
  auto dec = rollout::TpDecoder::Create(config, group, ops.get(), nullptr, tpo);
  if (!dec.ok()) {
    std::fprintf(stderr, "%s\n", dec.status().ToString().c_str());
    return false;
  }
  rollout::TpDecoder* raw = dec->get();
  model::FlatParamProvider pp(raw->slice_layout(), slice.data(), nullptr);
  std::vector<float> full_copy;  // sequence-parallel steps' weights
  if (shift > 0) full_copy = full;
  model::FlatParamProvider fp(raw->full_layout(), full_copy.data(), nullptr);
  if (shift > 0) raw->SetFullParams(&fp);
  out->full_copy_bytes = full_copy.size() * sizeof(float);
  out->slice_bytes = slice.size() * sizeof(float);
  rollout::RolloutEngine eng(std::move(*dec), ops.get());
  const auto reqs = Requests(f);
  for (int rep = 0; rep < f.repeats; ++rep) {
    raw->ResetStats();
    auto res = eng.Generate(reqs, Options(f), pp);
    if (!res.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, res.status().ToString().c_str());
      return false;
    }
    if (rep == 0 || res->seconds < out->seconds) {
      out->seconds = res->seconds;
      out->prefill_seconds = res->prefill_seconds;
      out->decode_seconds = res->decode_seconds;
      out->tokens = res->generated_tokens;
      out->stats = raw->stats();
      out->out.clear();
      for (const auto& s : res->sequences) out->out.push_back(s.tokens);
    }
  }
  return true;
}

bool RunCase(const model::ModelConfig& config, const std::vector<float>& full, int tp, bool overlap, int shift,
             const Flags& f, CaseResult* out) {
  if (tp == 1) return RunRank(config, full, nullptr, 1, overlap, 0, f, out);
  comm::InMemoryStore store;
  std::vector<CaseResult> ranks(tp);
  std::vector<int> ok(tp, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      comm::CollectiveOptions co;
      co.address = "127.0.0.1";
      co.timeout = std::chrono::milliseconds(120000);
      auto c = comm::MakeCollective("gloo", store, r, tp, co);
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.status().ToString().c_str());
        return;
      }
      ok[r] = RunRank(config, full, c->get(), tp, overlap, shift, f, &ranks[r]) ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  if (std::count(ok.begin(), ok.end(), 1) != tp) return false;
  *out = ranks[0];
  for (const CaseResult& r : ranks) {
    out->seconds = std::max(out->seconds, r.seconds);
    out->prefill_seconds = std::max(out->prefill_seconds, r.prefill_seconds);
    out->decode_seconds = std::max(out->decode_seconds, r.decode_seconds);
  }
  return true;
}

// Two ranks, shards by zero::ComputeShardMap, TP=2 slices.
bool SwitchBytes(const model::ModelConfig& config, const std::vector<float>& full) {
  const model::ParamLayout layout(config);
  std::vector<zero::Unit> units;
  for (int u = 0; u < layout.num_units(); ++u) units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  comm::InMemoryStore store;
  std::vector<rollout::TpGatherStats> stats(2);
  std::vector<int> ok(2, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      comm::CollectiveOptions co;
      co.address = "127.0.0.1";
      co.prefix = "switch";
      auto c = comm::MakeCollective("gloo", store, r, 2, co);
      if (!c.ok()) return;
      std::vector<float> shard;
      for (const zero::ShardPiece& p : zero::ComputeShardMap(units, r, 2)) {
        const float* src = full.data() + units[p.unit].offset + p.unit_offset;
        shard.insert(shard.end(), src, src + p.size);
      }
      auto map = rollout::MakeTpSliceMap(config, r, 2);
      if (!map.ok()) return;
      std::vector<float> slice(map->slice_floats);
      auto st =
          rollout::GatherTpSlice(**c, config, 2, units, shard.data(), slice.data(), std::chrono::milliseconds(120000));
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, st.status().ToString().c_str());
        return;
      }
      stats[r] = *st;
      ok[r] = 1;
    });
  }
  for (auto& t : threads) t.join();
  if (ok[0] + ok[1] != 2) return false;
  std::printf(
      "switch (ZeRO shards over 2 ranks -> TP=2 slices), per rank: slice %.1f MB, received %.1f MB, "
      "full gather %.1f MB (%.0f%% of it), %.3f s\n",
      stats[0].slice_bytes / 1e6, stats[0].bytes_received / 1e6, stats[0].full_gather_bytes / 1e6,
      100.0 * stats[0].bytes_received / stats[0].full_gather_bytes, std::max(stats[0].seconds, stats[1].seconds));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  kernels::SetCpuThreads(1);
  nlohmann::json j = {{"vocab_size", f.vocab},           {"hidden_size", f.hidden},
                      {"intermediate_size", f.inter},    {"num_hidden_layers", f.layers},
                      {"num_attention_heads", f.heads},  {"num_key_value_heads", f.kv_heads},
                      {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-5}};
  auto config = model::ParseConfigJson(j.dump());
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 2;
  }
  const model::ParamLayout layout(*config);
  std::vector<float> full(layout.total_floats());
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd;
  for (const auto& t : layout.tensors()) {
    for (size_t i = 0; i < t.numel; ++i) {
      full[t.offset + i] = t.kind == model::TensorView::Kind::kNorm ? 1.f : 0.02f * nd(rng);
    }
  }
  std::printf(
      "model: hidden %d, heads %d/%d, inter %d, layers %d, vocab %d (%.1fM params); %d seqs x (%d prompt + %d new), "
      "groups of %d\n",
      f.hidden, f.heads, f.kv_heads, f.inter, f.layers, f.vocab, layout.total_floats() / 1e6, f.seqs, f.prompt,
      f.new_tokens, f.group);
  std::printf("%-16s %10s %10s %10s %10s %8s %12s %12s %8s %6s\n", "case", "tokens/s", "gen s", "prefill s", "decode s",
              "AR calls", "AR s", "waited s", "hidden", "same");
  CaseResult base;
  struct Case {
    const char* name;
    int tp;
    bool overlap;
    int shift;
  };
  std::vector<Case> cases = {Case{"tp1", 1, false, 0}, Case{"tp2", 2, false, 0}, Case{"tp2-overlap", 2, true, 0}};
  if (f.shift > 0) cases.push_back(Case{"tp2-shift", 2, true, f.shift});
  CaseResult shifted;
  for (const Case& c : cases) {
    CaseResult r;
    if (!RunCase(*config, full, c.tp, c.overlap, c.shift, f, &r)) return 1;
    if (c.tp == 1) base = r;
    if (c.shift > 0) shifted = r;
    const bool same = r.out == base.out;
    std::printf("%-16s %10.1f %10.3f %10.3f %10.3f %8lld %12.4f %12.4f %7.1f%% %6s\n", c.name, r.tokens / r.seconds,
                r.seconds, r.prefill_seconds, r.decode_seconds, static_cast<long long>(r.stats.allreduces),
                r.stats.allreduce_seconds, r.stats.exposed_seconds, 100.0 * r.stats.hidden_share(),
                same ? "yes" : "NO");
  }
  if (f.shift > 0) {
    const rollout::TpStats& s = shifted.stats;
    std::printf(
        "tp2-shift (threshold %d rows): %lld sequence-parallel steps (%lld rows), %lld tensor-parallel steps (%lld "
        "rows); all-to-all + all-gather %.4f s, %.1f MB; full weights %.1f MB per rank beside a %.1f MB slice\n",
        f.shift, static_cast<long long>(s.sp_steps), static_cast<long long>(s.sp_rows),
        static_cast<long long>(s.tp_steps), static_cast<long long>(s.tp_rows), s.sp_comm_seconds, s.sp_bytes / 1e6,
        shifted.full_copy_bytes / 1e6, shifted.slice_bytes / 1e6);
  }
  return SwitchBytes(*config, full) ? 0 : 1;
}
