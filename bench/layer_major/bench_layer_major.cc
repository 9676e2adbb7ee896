// Layer-major against micro-batch gradient accumulation: one data-parallel
// training step of N = 2 ranks (threads over Gloo on 127.0.0.1, one CPU
// thread each) over M micro-batches of `tokens` tokens, at ZeRO stages 0-3.
// Prints per stage, M and accumulation the median step time (the slowest
// rank's) and the bytes rank 0 sent per step by collective kind.
//
//   bench_layer_major [--config tiny|B] [--steps 3] [--tokens 128]
//                     [--stages 0,2,3] [--micro 1,4]
//
// Config tiny: tests/support/tiny_model.yaml (vocab 99, hidden 32, 2
// layers). Config B: vocab 4096, hidden 512, 8 layers, 8/4 heads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/backends.h"
#include "worker/comm/collective.h"
#include "worker/comm/store.h"
#include "worker/model/layer_major.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem {
namespace {

constexpr int kRanks = 2;

struct Row {
  double seconds = 0;
  uint64_t rs = 0, ag = 0, ar = 0;  // bytes rank 0 sent per step
};

model::ModelConfig Config(const std::string& name) {
  model::ModelConfig c;
  if (name == "B") {
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.intermediate_size = 1376;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 1024;
  } else {
    c.vocab_size = 99;
    c.hidden_size = 32;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 1024;
  }
  return c;
}

Row Measure(const model::ModelConfig& config, int stage, int micro, bool layer_major, int tokens, int steps) {
  comm::InMemoryStore store;
  Row row;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      comm::CollectiveOptions co;
      co.address = "127.0.0.1";
      co.timeout = comm::Timeout(300000);
      auto c = comm::MakeCollective("gloo", store, r, kRanks, co);
      if (!c.ok()) std::abort();
      comm::Collective& comm = **c;
      auto ops = kernels::MakeCpuOps(1);
      std::vector<std::unique_ptr<model::Model>> models;
      for (int m = 0; m < (layer_major ? micro : 1); ++m) {
        models.push_back(std::make_unique<model::Model>(config, ops.get(), tokens));
      }
      const model::ParamLayout& layout = models[0]->layout();
      zero::ZeroOptions o;
      o.stage = stage;
      for (int u = 0; u < layout.num_units(); ++u) o.units.push_back({layout.unit_offset(u), layout.unit_size(u)});
      o.comm = &comm;
      o.ops = ops.get();
      o.reduce_on_release = layer_major;
      auto z = zero::ZeroOptimizer::Create(o);
      if (!z.ok()) std::abort();
      std::vector<float> init(layout.total_floats());
      models[0]->InitParams(1, init.data());
      if (!(*z)->InitFromFull(init.data()).ok()) std::abort();
      // One sequence of `tokens` + 1 ids per micro-batch, from (rank, m).
      std::vector<model::Batch> batches(micro);
      for (int m = 0; m < micro; ++m) {
        std::vector<int32_t> seq(tokens + 1);
        for (int t = 0; t <= tokens; ++t) seq[t] = (t * 31 + m * 7 + r * 13) % config.vocab_size;
        batches[m].AddSequence(seq);
      }
      std::vector<float> logp(tokens);
      std::vector<std::vector<float>> dlogp(micro, std::vector<float>(tokens, -1.f / (tokens * micro * kRanks)));
      std::vector<model::BackwardOptions> bopts(micro);
      std::vector<model::Model*> ms;
      std::vector<const float*> ds;
      for (int m = 0; m < micro; ++m) {
        ms.push_back(models[layer_major ? m : 0].get());
        ds.push_back(dlogp[m].data());
      }
      std::vector<double> times;
      comm::ByteCount rs, ag, ar;
      for (int s = 0; s <= steps; ++s) {  // step 0 warms up
        if (!comm.barrier(comm::Timeout(300000)).ok()) std::abort();
        comm.ResetBytes();
        const auto t0 = std::chrono::steady_clock::now();
        (*z)->ZeroGrads();
        for (int m = 0; m < micro; ++m) {
          if (!ms[m]->ForwardLogprobs(batches[m], **z, logp.data()).ok()) std::abort();
          if (!layer_major && !ms[m]->Backward(ds[m], **z).ok()) std::abort();
        }
        if (layer_major && !model::LayerMajorBackward(ms, ds, bopts, **z).ok()) std::abort();
        if (!(*z)->Step(1e-3f, 1.f).ok()) std::abort();
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > 0) {
          times.push_back(sec);
          rs = comm.bytes(comm::CollectiveKind::kReduceScatter);
          ag = comm.bytes(comm::CollectiveKind::kAllgather);
          ar = comm.bytes(comm::CollectiveKind::kAllreduce);
        }
      }
      std::sort(times.begin(), times.end());
      std::lock_guard<std::mutex> lock(mu);
      row.seconds = std::max(row.seconds, times[times.size() / 2]);
      if (r == 0) {
        row.rs = rs.sent;
        row.ag = ag.sent;
        row.ar = ar.sent;
      }
    });
  }
  for (auto& t : threads) t.join();
  return row;
}

std::vector<int> Ints(const char* s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v)) {
      std::fprintf(stderr, "bad integer list '%s'\n", s);
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

int Main(int argc, char** argv) {
  std::string config = "tiny";
  int steps = 3, tokens = 128;
  std::vector<int> stages = {0, 2, 3}, micros = {1, 4};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--config") {
      config = argv[i + 1];
    } else if (k == "--steps") {
      steps = std::max(1, std::atoi(argv[i + 1]));
    } else if (k == "--tokens") {
      tokens = std::max(2, std::atoi(argv[i + 1]));
    } else if (k == "--stages") {
      stages = Ints(argv[i + 1]);
    } else if (k == "--micro") {
      micros = Ints(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s (see the header of bench_layer_major.cc)\n", k.c_str());
      return 2;
    }
  }
  if (config != "tiny" && config != "B") {
    std::fprintf(stderr, "--config: tiny or B, not '%s'\n", config.c_str());
    return 2;
  }
  const model::ModelConfig c = Config(config);
  std::printf("config %s, N=%d ranks (1 thread each), %d tokens per micro-batch, median of %d steps\n", config.c_str(),
              kRanks, tokens, steps);
  std::printf("| stage | M | accumulation | s/step | reduce_scatter B/step | allgather B/step | allreduce B/step |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int stage : stages) {
    for (int m : micros) {
      for (bool lm : {false, true}) {
        const Row row = Measure(c, stage, m, lm, tokens, steps);
        std::printf("| %d | %d | %s | %.3f | %llu | %llu | %llu |\n", stage, m, lm ? "layer_major" : "micro_batch",
                    row.seconds, static_cast<unsigned long long>(row.rs), static_cast<unsigned long long>(row.ag),
                    static_cast<unsigned long long>(row.ar));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
