// bench_sequence_parallel: sequence parallelism (worker/model/
// sequence_parallel.h) with N ranks as N threads over Gloo on 127.0.0.1.
//
//   bench_sequence_parallel [--tokens T] [--bytes-only] [--ranks-max N] [--iters N]
//
// Table 1, for N = 1..ranks-max (default 4): bytes each rank sent plus
// received (the largest over ranks) for one layer's forward and backward of
// one sequence of T tokens (default 8192), H = 8 heads, D = 32: a linear
// layer (all_scan and the state-gradient send/recv) and a window:256 layer
// (the K/V all-gathers and the dK/dV reduce-scatter; a full layer moves the
// same bytes); and the linear layer's forward and backward time, the
// slowest rank's mean of 3 calls after a warm-up (one compute thread per
// rank).
// Table 2 (unless --bytes-only): training tokens/s (forward + backward of
// the log-probs of one T-token sequence; median of --iters steps, default 3,
// after a warm-up step) and the model memory per rank (workspace:
// activations and scratch, plus the sequence-parallel K/V scratch; the
// parameters and gradients, the same on every rank, in a column of their
// own) of two config-A-shaped models (vocab 512, hidden 256, intermediate
// 688, 8 heads, 8 KV heads, 4 layers): full attention everywhere, and a
// hybrid [linear, full, window:256, full]; each on 1 rank with 2 compute
// threads and on a group of 2 ranks with 1 thread each.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"
#include "worker/model/config.h"
#include "worker/model/linear_attention_sp.h"
#include "worker/model/model.h"
#include "worker/model/softmax_attention_sp.h"
#include "worker/model/sp_attention.h"

namespace {

using tandem::comm::Collective;
using tandem::comm::CollectiveKind;
namespace model = tandem::model;
namespace kernels = tandem::kernels;
constexpr tandem::comm::Timeout kTimeout{600000};

void RunRanks(int n, const std::function<void(Collective&)>& fn) {
  tandem::comm::InMemoryStore store;
  tandem::comm::CollectiveOptions o;
  o.address = "127.0.0.1";
  o.timeout = kTimeout;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto c = tandem::comm::MakeCollective("gloo", store, r, n, o);
      if (!c.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, c.status().ToString().c_str());
        std::exit(1);
      }
      fn(**c);
    });
  }
  for (auto& t : threads) t.join();
}

void Check(const absl::Status& st) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    std::exit(1);
  }
}

std::vector<float> Random(size_t n, int salt) {
  std::vector<float> v(n);
  std::mt19937 g(salt);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (float& x : v) x = d(g);
  return v;
}

uint64_t Moved(const Collective& c, std::initializer_list<CollectiveKind> kinds) {
  uint64_t b = 0;
  for (CollectiveKind k : kinds) b += c.bytes(k).sent + c.bytes(k).received;
  return b;
}

void BytesTable(int T, int max_ranks) {
  const int H = 8, D = 32;
  const size_t n = size_t(T) * H * D;
  const auto q = Random(n, 1), k = Random(n, 2), v = Random(n, 3), dout = Random(n, 4);
  std::vector<float> decay(size_t(T) * H);
  for (size_t i = 0; i < decay.size(); ++i) decay[i] = -0.05f;
  std::printf("T = %d, H = %d, D = %d; one state = %d bytes, K+V of one rank's rows = %.1f MB at N = 1\n", T, H, D,
              H * D * D * 4, 2.0 * n * 4 / 1e6);
  std::printf(
      "| ranks | linear: all_scan + send/recv bytes per rank | window:256: allgather + reduce_scatter bytes per rank "
      "| linear forward ms | linear backward ms |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int N = 1; N <= max_ranks; ++N) {
    std::vector<uint64_t> lin(N), soft(N);
    std::vector<double> fwd_s(N), bwd_s(N);
    const std::vector<int32_t> cu{0, T};
    RunRanks(N, [&](Collective& c) {
      auto ops = kernels::MakeCpuOps(1);
      model::SequenceSlice s;
      const std::vector<int> b = model::SliceBounds(T, N);
      s.rank = c.rank();
      s.size = N;
      s.offset = b[c.rank()];
      s.rows = b[c.rank() + 1] - b[c.rank()];
      s.global_cu = cu;
      s.bounds = b;
      const std::vector<int32_t> local{0, s.rows};
      const size_t o = size_t(s.offset) * H * D;
      std::vector<float> out(size_t(s.rows) * H * D), lse(size_t(s.rows) * H), dq(out.size()), dk(out.size()),
          dv(out.size());
      kernels::LinearAttentionParams lp{H, D, D, 0.f};
      const float* g = decay.data() + size_t(s.offset) * H;
      auto forward = [&] {
        Check(model::LinearAttentionSliceForward(c, *ops, lp, s, local.data(), 1, q.data() + o, k.data() + o,
                                                 v.data() + o, g, out.data(), kTimeout));
      };
      auto backward = [&] {
        Check(model::LinearAttentionSliceBackward(c, *ops, lp, s, local.data(), 1, q.data() + o, k.data() + o,
                                                  v.data() + o, g, dout.data() + o, dq.data(), dk.data(), dv.data(),
                                                  kTimeout));
      };
      forward();
      backward();
      lin[c.rank()] = Moved(c, {CollectiveKind::kAllScan, CollectiveKind::kSendRecv});
      constexpr int kReps = 3;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kReps; ++i) forward();
      fwd_s[c.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kReps;
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kReps; ++i) backward();
      bwd_s[c.rank()] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kReps;
      c.ResetBytes();
      kernels::AttentionParams ap;
      ap.num_heads = H;
      ap.num_kv_heads = H;
      ap.head_dim = D;
      ap.window = 256;
      model::SoftmaxSpScratch scratch;
      Check(model::SoftmaxAttentionSpForward(c, *ops, ap, s, q.data() + o, k.data() + o, v.data() + o, out.data(),
                                             lse.data(), scratch, kTimeout));
      Check(model::SoftmaxAttentionSpBackward(c, *ops, ap, s, q.data() + o, k.data() + o, v.data() + o, out.data(),
                                              dout.data() + o, lse.data(), dq.data(), dk.data(), dv.data(), scratch,
                                              kTimeout));
      soft[c.rank()] = Moved(c, {CollectiveKind::kAllgather, CollectiveKind::kReduceScatter});
    });
    std::printf(
        "| %d | %llu | %llu | %.1f | %.1f |\n", N, (unsigned long long)*std::max_element(lin.begin(), lin.end()),
        (unsigned long long)*std::max_element(soft.begin(), soft.end()),
        1e3 * *std::max_element(fwd_s.begin(), fwd_s.end()), 1e3 * *std::max_element(bwd_s.begin(), bwd_s.end()));
  }
}

model::ModelConfig ConfigA(const char* layer_types) {
  auto c = model::ParseConfigJson(std::string(R"({"model_type": "llama", "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 65536, "tandem_layer_types": )") +
                                  layer_types + "}");
  Check(c.status());
  return *c;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double MiB(size_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// One model at T tokens: 1 rank with 2 threads, then SP = 2 with 1 thread
// each; prints two rows.
void ThroughputRows(const char* name, const char* layer_types, int T, int iters) {
  const model::ModelConfig config = ConfigA(layer_types);
  model::Batch batch;
  std::vector<int32_t> seq(T + 1);
  std::mt19937 g(7);
  for (int32_t& t : seq) t = static_cast<int32_t>(g() % 512);
  batch.AddSequence(seq);
  std::vector<float> params;
  {
    auto ops = kernels::MakeCpuOps(1);
    model::Model m(config, ops.get());
    params.resize(m.layout().total_floats());
    m.InitParams(1, params.data());
  }
  const double state_mib = MiB(2 * params.size() * sizeof(float));
  auto step = [&](model::Model& m, const model::Batch& b, std::vector<float>& grads) {
    model::FlatParamProvider pp(m.layout(), params.data(), grads.data());
    std::vector<float> logp(b.num_tokens()), dlogp(b.num_tokens(), -1.f / T);
    Check(m.ForwardLogprobs(b, pp, logp.data()));
    Check(m.Backward(dlogp.data(), pp));
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<double> one, two;
  double one_mib = 0, two_mib = 0;
  {
    auto ops = kernels::MakeCpuOps(2);
    model::Model m(config, ops.get());
    std::vector<float> grads(params.size());
    for (int i = 0; i <= iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step(m, batch, grads);
      if (i > 0) one.push_back(Seconds(t0));
    }
    one_mib = MiB(m.workspace_bytes());
  }
  std::vector<double> rank_mib(2, 0);
  RunRanks(2, [&](Collective& c) {
    auto ops = kernels::MakeCpuOps(1);
    model::Model m(config, ops.get());
    model::CollectiveSequenceAttention sp(&c, ops.get(), kTimeout);
    m.SetSequenceAttention(&sp);
    auto local = model::SliceBatch(batch, c.rank(), 2, model::SliceCostOf(config));
    Check(local.status());
    std::vector<float> grads(params.size());
    for (int i = 0; i <= iters; ++i) {
      Check(c.barrier(kTimeout));
      const auto t0 = std::chrono::steady_clock::now();
      step(m, *local, grads);
      Check(c.barrier(kTimeout));
      if (i > 0 && c.rank() == 0) two.push_back(Seconds(t0));
    }
    rank_mib[c.rank()] = MiB(m.workspace_bytes() + sp.scratch_bytes());
  });
  two_mib = *std::max_element(rank_mib.begin(), rank_mib.end());
  std::printf("| %s | 1 rank, 2 threads | %d | %.2f | %.0f | %.1f | %.1f |\n", name, T, median(one), T / median(one),
              one_mib, state_mib);
  std::printf("| %s | SP = 2, 1 thread each | %d | %.2f | %.0f | %.1f | %.1f |\n", name, T, median(two),
              T / median(two), two_mib, state_mib);
  std::fflush(stdout);
}

void ThroughputTable(int T, int iters) {
  std::printf(
      "| model | setup | T | s per step (median of %d) | tokens/s | model workspace MiB per rank (largest) | "
      "params + grads MiB per rank |\n|---|---|---|---|---|---|---|\n",
      iters);
  ThroughputRows("full x4", R"(["full", "full", "full", "full"])", T, iters);
  ThroughputRows("hybrid", R"(["linear", "full", "window:256", "full"])", T, iters);
}

}  // namespace

int main(int argc, char** argv) {
  int T = 8192, max_ranks = 4, iters = 3;
  bool bytes_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      T = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--ranks-max") && i + 1 < argc) {
      max_ranks = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--bytes-only")) {
      bytes_only = true;
    } else {
      std::fprintf(stderr, "usage: %s [--tokens T] [--ranks-max N] [--iters N] [--bytes-only]\n", argv[0]);
      return 2;
    }
  }
  if (T < 8 || T > 65536 || max_ranks < 1 || iters < 1) {
    std::fprintf(stderr, "--tokens must be in [8, 65536], --ranks-max and --iters >= 1\n");
    return 2;
  }
  BytesTable(T, max_ranks);
  if (!bytes_only) ThroughputTable(T, iters);
  return 0;
}
