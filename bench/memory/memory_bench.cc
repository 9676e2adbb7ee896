// Per-rank memory of a Qwen2.5-0.5B-shaped model (bench/model/
// qwen2.5-0.5b-config.json: hidden 896, 24 layers, 14 heads, 2 kv heads,
// intermediate 4864, vocab 151936, tied embeddings; random weights) at ZeRO
// stage 3 (fp32) at world size N. Each rank runs one training micro-batch (one sequence of seq_len tokens: forward
// and backward over the ZeRO-3 gathers) per activation checkpointing mode
// and one reference log-prob forward over the sharded KL reference. Every
// figure is bytes allocated through a rank's DeviceMemory (its allocation
// ledger) or held by the owning object's arrays, never an estimate:
//
//   parameters, gradients, optimizer  ZeroOptimizer::memory()
//   ZeRO temporaries                  its gather and gradient unit buffers
//   activations                       Model::activation_bytes() (workspace
//                                     and stored SwiGLU inputs), of which
//                                     saved = saved_activation_bytes()
//   reference, full                   the Psi-float copy every rank holds
//                                     (allocated and counted, not filled)
//   reference, sharded                ShardedParams: shard + peak unit buffers
//
// How the ranks run: "threads" runs all N as threads over Gloo on
// 127.0.0.1 (N full ZeRO states in one process: about 5 GB resident per
// rank at N = 4); "rank0" runs rank 0 alone over a local stand-in for the
// other ranks' side of every collective (an allgather leaves their pieces
// zero, a reduce-scatter keeps this rank's own contribution). A rank's
// allocations depend only on the unit table, its rank and N, so rank 0's
// figures are those of a real N-rank run; its numerics are not (and are
// not reported), except that the sharded reference must still reproduce
// the policy's log-probs over the same gathered weights.
//
//   ./build/bin/bench_memory [ranks=4] [seq_len=128] [rank0|threads] [config.json]
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "kernels/memory.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"
#include "worker/model/config.h"
#include "worker/model/model.h"
#include "worker/zero/sharded_params.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem {
namespace {

using model::ActivationCheckpointing;

struct RankFigures {
  zero::MemoryReport zero;
  size_t act[2] = {0, 0}, saved[2] = {0, 0};
  double secs[2] = {0, 0};
  size_t ref_full = 0, ref_shard = 0, ref_buffers = 0;
  double ref_secs = 0;
  bool ref_matches = false;
  bool ok = false;
};

// A weight from its global index: N(0, 0.02)-like for matrices (a hash,
// uniform with the same std), 1 for norms, 0 for biases.
float Weight(size_t i, model::TensorView::Kind kind) {
  if (kind == model::TensorView::Kind::kNorm) return 1.f;
  if (kind == model::TensorView::Kind::kBias) return 0.f;
  uint64_t z = i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double u = static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  return static_cast<float>((2 * u - 1) * 0.02 * 1.7320508075688772);
}

// This rank's shard (shard_map order) of the random weights.
std::vector<float> RandomShard(const model::ParamLayout& layout, const std::vector<zero::Unit>& units,
                               const std::vector<zero::ShardPiece>& map, size_t shard_size) {
  std::vector<float> shard(shard_size);
  for (const zero::ShardPiece& p : map) {
    const size_t begin = units[p.unit].offset + p.unit_offset, end = begin + p.size;
    for (const model::TensorView& t : layout.tensors()) {
      const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
      for (size_t i = lo; i < hi; ++i) shard[p.shard_offset + (i - begin)] = Weight(i, t.kind);
    }
  }
  return shard;
}

// Rank `rank` of `world` alone: the other ranks' side of each collective is
// a local stand-in (see the header comment). Stateless, so thread-safe.
class StandInCollective final : public comm::Collective {
 public:
  StandInCollective(int rank, int world) : comm::Collective(rank, world) {}
  std::string_view backend() const override { return "stand-in"; }
  absl::Status allreduce(float*, size_t, comm::ReduceOp, comm::Timeout) override { return absl::OkStatus(); }
  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& counts, comm::Timeout) override {
    std::memmove(out, in + Before(counts), counts[rank()] * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& counts, comm::Timeout) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    const size_t mine = Before(counts), count = counts[rank()];
    std::memmove(out + mine, in, count * sizeof(float));
    std::memset(out, 0, mine * sizeof(float));
    std::memset(out + mine + count, 0, (total - mine - count) * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status broadcast(float*, size_t, int, comm::Timeout) override { return absl::OkStatus(); }
  absl::Status barrier(comm::Timeout) override { return absl::OkStatus(); }
  absl::Status send(const void*, size_t, int, uint32_t, comm::Timeout) override {
    return absl::UnimplementedError("stand-in collective: send");
  }
  absl::Status recv(void*, size_t, int, uint32_t, comm::Timeout) override {
    return absl::UnimplementedError("stand-in collective: recv");
  }
  absl::Status all_scan(float*, size_t, const comm::ScanOp&, comm::Timeout) override {
    return absl::UnimplementedError("stand-in collective: all_scan");
  }
  void Abort() override {}

 private:
  size_t Before(const std::vector<size_t>& counts) const {
    size_t n = 0;
    for (int r = 0; r < rank(); ++r) n += counts[r];
    return n;
  }
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void RunRank(int rank, int n, int seq_len, bool stand_in, const model::ModelConfig& config, comm::Store& store,
             RankFigures* out) {
  comm::CollectiveOptions co;
  co.address = "127.0.0.1";
  co.timeout = comm::Timeout(600000);
  std::unique_ptr<comm::Collective> owned;
  if (stand_in) {
    owned = std::make_unique<StandInCollective>(rank, n);
  } else {
    auto c = comm::MakeCollective("gloo", store, rank, n, co);
    if (!c.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
      return;
    }
    owned = std::move(*c);
  }
  comm::Collective& comm = *owned;
  auto ops = kernels::MakeCpuOps(1);
  auto zero_mem = kernels::MakeHostMemory();
  model::Model probe(config, ops.get());
  const model::ParamLayout& layout = probe.layout();
  std::vector<zero::Unit> units;
  for (int u = 0; u < layout.num_units(); ++u) units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  zero::ZeroOptions zo;
  zo.stage = 3;
  zo.units = units;
  zo.comm = &comm;
  zo.ops = ops.get();
  zo.memory = zero_mem.get();
  zo.timeout = co.timeout;
  auto z = zero::ZeroOptimizer::Create(zo);
  if (!z.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, z.status().ToString().c_str());
    return;
  }
  zero::ZeroOptimizer& opt = **z;
  {
    const std::vector<float> shard = RandomShard(layout, units, opt.shard_map(), opt.shard_size());
    opt.LoadParamShard(shard.data());
  }

  // The same sequence on every rank (the figures do not depend on it).
  model::Batch batch;
  std::vector<int32_t> seq(seq_len + 1);
  for (int i = 0; i <= seq_len; ++i) seq[i] = static_cast<int32_t>((i * 7919 + 17) % config.vocab_size);
  batch.AddSequence(seq);
  const int T = batch.num_tokens();
  std::vector<float> logp(T), policy_logp(T), dlogp(T, -1.f / T);

  const ActivationCheckpointing modes[2] = {ActivationCheckpointing::kNone, ActivationCheckpointing::kLayer};
  for (int m = 0; m < 2; ++m) {
    auto act_mem = kernels::MakeHostMemory();
    model::Model model(config, ops.get(), 0, act_mem.get());
    model.set_activation_checkpointing(modes[m]);
    opt.ZeroGrads();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = model.ForwardLogprobs(batch, opt, logp.data());
    if (s.ok()) s = model.Backward(dlogp.data(), opt);
    if (s.ok()) s = opt.Drain();
    if (s.ok()) s = opt.status();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return;
    }
    out->secs[m] = Seconds(t0);
    out->act[m] = model.activation_bytes();
    out->saved[m] = model.saved_activation_bytes();
    if (m == 0) policy_logp = logp;
  }
  out->zero = opt.memory();

  // The reference: the full copy each rank holds without sharding (counted
  // by its memory's ledger), and the sharded one, which runs the log-prob
  // forward on the policy's weights (so its log-probs must equal the
  // policy's bit for bit).
  {
    auto full_mem = kernels::MakeHostMemory();
    kernels::DeviceArray<float> full;
    if (!full.Allocate(full_mem.get(), opt.num_params())) return;
    out->ref_full = full_mem->allocated_bytes();
  }
  auto ref_mem = kernels::MakeHostMemory();
  auto ref = zero::ShardedParams::Create(units, &comm, ref_mem.get(), co.timeout);
  if (!ref.ok()) return;
  {
    std::vector<float> shard(opt.shard_size());
    opt.CopyParamShard(shard.data());
    (*ref)->LoadShard(shard.data());
  }
  auto act_mem = kernels::MakeHostMemory();
  model::Model model(config, ops.get(), 0, act_mem.get());
  const auto t0 = std::chrono::steady_clock::now();
  if (!model.ForwardLogprobs(batch, **ref, logp.data()).ok() || !(*ref)->status().ok()) return;
  out->ref_secs = Seconds(t0);
  out->ref_shard = (*ref)->shard_bytes();
  out->ref_buffers = (*ref)->peak_buffer_bytes();
  out->ref_matches = std::memcmp(logp.data(), policy_logp.data(), T * sizeof(float)) == 0;
  out->ok = true;
}

double MiB(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

int Main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4;
  const int seq_len = argc > 2 ? std::atoi(argv[2]) : 128;
  const std::string how = argc > 3 ? argv[3] : "rank0";
  const std::string path = argc > 4 ? argv[4] : TANDEM_QWEN_CONFIG;
  if (n < 1 || seq_len < 1 || (how != "rank0" && how != "threads")) {
    std::fprintf(stderr, "usage: bench_memory [ranks>=1] [seq_len>=1] [rank0|threads] [config.json]\n");
    return 2;
  }
  const bool stand_in = how == "rank0";
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  auto config = model::ParseConfigJson(text.str());
  if (!config.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), config.status().ToString().c_str());
    return 1;
  }
  comm::InMemoryStore store;
  const int run = stand_in ? 1 : n;
  std::vector<RankFigures> figs(run);
  std::vector<std::thread> threads;
  for (int r = 0; r < run; ++r) {
    threads.emplace_back([&, r] { RunRank(r, n, seq_len, stand_in, *config, store, &figs[r]); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < run; ++r) {
    if (!figs[r].ok) {
      std::fprintf(stderr, "rank %d failed\n", r);
      return 1;
    }
  }
  const RankFigures& a = figs[0];
  const model::ModelConfig& cfg = *config;
  std::printf("model %s: hidden %d, layers %d, heads %d/%d, intermediate %d, vocab %d, tied %d\n", path.c_str(),
              cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.KvHeads(), cfg.intermediate_size,
              cfg.vocab_size, cfg.tie_word_embeddings ? 1 : 0);
  std::printf("ZeRO-3 fp32, %d ranks (%s), micro-batch 1 sequence of %d tokens; rank 0, MiB\n\n", n,
              stand_in ? "rank 0 alone, the other ranks' side of each collective stood in" : "threads over gloo",
              seq_len);
  const double before =
      MiB(a.zero.param_bytes + a.zero.grad_bytes + a.zero.optimizer_bytes + a.zero.temp_bytes + a.act[0] + a.ref_full);
  const double after = MiB(a.zero.param_bytes + a.zero.grad_bytes + a.zero.optimizer_bytes + a.zero.temp_bytes +
                           a.act[1] + a.ref_shard + a.ref_buffers);
  std::printf("| per rank | before (checkpointing none, reference full) | after (layer, sharded) |\n");
  std::printf("|---|---:|---:|\n");
  std::printf("| parameters (shard) | %.1f | %.1f |\n", MiB(a.zero.param_bytes), MiB(a.zero.param_bytes));
  std::printf("| gradients (shard) | %.1f | %.1f |\n", MiB(a.zero.grad_bytes), MiB(a.zero.grad_bytes));
  std::printf("| optimizer state (m, v shards) | %.1f | %.1f |\n", MiB(a.zero.optimizer_bytes),
              MiB(a.zero.optimizer_bytes));
  std::printf("| ZeRO-3 unit buffers (gathers, gradients) | %.1f | %.1f |\n", MiB(a.zero.temp_bytes),
              MiB(a.zero.temp_bytes));
  std::printf("| activations, peak (saved across the step) | %.1f (%.1f) | %.1f (%.1f) |\n", MiB(a.act[0]),
              MiB(a.saved[0]), MiB(a.act[1]), MiB(a.saved[1]));
  std::printf("| KL reference policy | %.1f | %.1f (shard %.1f + unit buffers %.1f) |\n", MiB(a.ref_full),
              MiB(a.ref_shard + a.ref_buffers), MiB(a.ref_shard), MiB(a.ref_buffers));
  std::printf("| total | %.1f | %.1f |\n\n", before, after);
  std::printf("step time (forward + backward, rank 0): none %.1f s, layer %.1f s; sharded reference forward %.1f s\n",
              a.secs[0], a.secs[1], a.ref_secs);
  bool match = true;
  for (const RankFigures& f : figs) match = match && f.ref_matches;
  std::printf("sharded reference log-probs equal the policy's (same gathered weights) on every rank run: %s\n",
              match ? "yes" : "NO");
  return match ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
