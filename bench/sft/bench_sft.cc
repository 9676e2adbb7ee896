// bench_sft: time of one data-parallel SFT step (forward, backward, ZeRO
// step) with N ranks as N processes, one compute thread each, over Gloo on
// 127.0.0.1, and the share of the step spent communicating.
//
//   bench_sft --config B --workers 2 --stage 2 --steps 5 [--warmup 1]
//             [--precision fp32|bf16]
//
// Config B: vocab 4096, hidden 512, 8 layers, 8 heads, 4 KV heads,
// intermediate 1376; a global batch of 4 sequences of 512 tokens split
// across the ranks (N=2: 2 sequences each), loss on every token. "tiny" is a
// 2-layer hidden-64 model for smoke runs.
//
// Rendezvous: comm::FileStore in a fresh temporary directory (the processes
// are forked from this one). Communication time: every collective call the
// ZeRO optimizer makes is timed by a forwarding Collective (on its
// communication thread; with stages 2/3 much of it overlaps the backward
// pass); "exposed" is the time the job thread waits in ZeroOptimizer::Step
// (which drains the in-flight collectives) minus the time of the AdamW
// update measured alone. Rank 0 prints the figures; the exit status is 0
// when every rank succeeded.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backends.h"
#include "worker/comm/collective.h"
#include "worker/comm/file_store.h"
#include "worker/model/model.h"
#include "worker/zero/zero_optimizer.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Forwards every call to `inner` and adds its wall time to `seconds`.
class TimedCollective final : public comm::Collective {
 public:
  explicit TimedCollective(std::unique_ptr<comm::Collective> inner)
      : comm::Collective(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string_view backend() const override { return inner_->backend(); }
  absl::Status allreduce(float* d, size_t n, comm::ReduceOp op, comm::Timeout t) override {
    return Time([&] { return inner_->allreduce(d, n, op, t); });
  }
  absl::Status reduce_scatter(const float* in, float* out, const std::vector<size_t>& c, comm::Timeout t) override {
    return Time([&] { return inner_->reduce_scatter(in, out, c, t); });
  }
  absl::Status allgather(const float* in, float* out, const std::vector<size_t>& c, comm::Timeout t) override {
    return Time([&] { return inner_->allgather(in, out, c, t); });
  }
  absl::Status broadcast(float* d, size_t n, int root, comm::Timeout t) override {
    return Time([&] { return inner_->broadcast(d, n, root, t); });
  }
  absl::Status barrier(comm::Timeout t) override {
    return Time([&] { return inner_->barrier(t); });
  }
  absl::Status send(const void* d, size_t b, int peer, uint32_t tag, comm::Timeout t) override {
    return Time([&] { return inner_->send(d, b, peer, tag, t); });
  }
  absl::Status recv(void* d, size_t b, int peer, uint32_t tag, comm::Timeout t) override {
    return Time([&] { return inner_->recv(d, b, peer, tag, t); });
  }
  absl::Status all_scan(float* d, size_t n, const comm::ScanOp& op, comm::Timeout t) override {
    return Time([&] { return inner_->all_scan(d, n, op, t); });
  }
  void Abort() override { inner_->Abort(); }

  comm::Collective& inner() { return *inner_; }
  double TakeSeconds() { return nanos_.exchange(0) * 1e-9; }

 private:
  template <typename F>
  absl::Status Time(F&& f) {
    const auto t0 = Clock::now();
    absl::Status s = f();
    nanos_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    return s;
  }
  std::unique_ptr<comm::Collective> inner_;
  std::atomic<int64_t> nanos_{0};
};

struct Args {
  std::string config = "B";
  int workers = 1;
  int stage = 0;
  int steps = 5;
  int warmup = 1;
  int batch = 4;
  int seq = 512;
  std::string precision = "fp32";  // ZeroOptions.precision
};

model::ModelConfig ConfigFor(const std::string& name) {
  model::ModelConfig c;
  if (name == "tiny") {
    c.vocab_size = 99;
    c.hidden_size = 64;
    c.intermediate_size = 172;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
  } else {
    c.vocab_size = 4096;
    c.hidden_size = 512;
    c.intermediate_size = 1376;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
  }
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 2048;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

struct Figures {
  double step = 0, compute = 0, in_step = 0, comm = 0, adam = 0;
  double bytes_sent = 0;
};

// One rank; returns 0 on success. Rank 0 prints the report.
int RunRank(const Args& a, const std::string& store_dir, int rank) {
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(), s.ToString().c_str());
    return 1;
  };
  auto ops = kernels::MakeCpuOps(1);
  const model::ModelConfig cfg = ConfigFor(a.config);
  // Sequences of this rank: a contiguous slice of the global batch.
  const int lo = rank * a.batch / a.workers, hi = (rank + 1) * a.batch / a.workers;
  model::Batch batch;
  uint64_t x = 88172645463325252ull;
  for (int s = 0; s < a.batch; ++s) {
    std::vector<int32_t> seq(a.seq + 1);
    for (auto& t : seq) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      t = static_cast<int32_t>(3 + x % static_cast<uint64_t>(cfg.vocab_size - 3));
    }
    if (s >= lo && s < hi) batch.AddSequence(seq);
  }
  model::Model model(cfg, ops.get(), std::max(batch.num_tokens(), 1));
  const auto& layout = model.layout();
  std::vector<float> full(layout.total_floats());
  model.InitParams(7, full.data());

  comm::FileStore store(store_dir);
  comm::CollectiveOptions co;
  co.address = "127.0.0.1";
  co.timeout = std::chrono::milliseconds(120000);
  co.prefix = "bench";
  auto coll = comm::MakeCollective("gloo", store, rank, a.workers, co);
  if (!coll.ok()) return fail("rendezvous", coll.status());
  TimedCollective timed(std::move(*coll));

  zero::ZeroOptions zo;
  zo.stage = a.stage;
  auto precision = zero::ParsePrecision(a.precision);
  if (!precision.ok()) return fail("precision", precision.status());
  zo.precision = *precision;
  for (int u = 0; u < layout.num_units(); ++u) {
    zo.units.push_back({layout.unit_offset(u), layout.unit_size(u)});
  }
  zo.comm = &timed;
  zo.ops = ops.get();
  zo.timeout = std::chrono::milliseconds(120000);
  auto z = zero::ZeroOptimizer::Create(zo);
  if (!z.ok()) return fail("zero", z.status());
  if (absl::Status s = (*z)->InitFromFull(full.data()); !s.ok()) return fail("init", s);
  full.clear();
  full.shrink_to_fit();

  // AdamW alone on this rank's optimizer range (what Step computes besides
  // communication), to separate exposed communication from the update.
  const size_t adam_n = a.stage == 0 ? layout.total_floats() : (*z)->shard_size();
  double adam_s = 0;
  {
    std::vector<float> p(adam_n, 0.1f), g(adam_n, 0.01f), m(adam_n, 0.f), v(adam_n, 0.f);
    ops->adamw_step(p.data(), g.data(), m.data(), v.data(), adam_n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.f, 1);
    const auto t0 = Clock::now();
    for (int i = 0; i < 3; ++i) {
      ops->adamw_step(p.data(), g.data(), m.data(), v.data(), adam_n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.f, 2 + i);
    }
    adam_s = Since(t0) / 3;
  }

  const int t = batch.num_tokens();
  std::vector<float> logp(t), dlogp(t, -1.f / static_cast<float>(a.batch * a.seq));
  Figures sum;
  double loss = 0;
  for (int it = 0; it < a.warmup + a.steps; ++it) {
    timed.TakeSeconds();
    timed.inner().ResetBytes();
    const auto t0 = Clock::now();
    (*z)->ZeroGrads();
    if (t > 0) {
      if (absl::Status s = model.ForwardLogprobs(batch, **z, logp.data()); !s.ok()) return fail("forward", s);
      if (absl::Status s = model.Backward(dlogp.data(), **z); !s.ok()) return fail("backward", s);
    }
    const double compute = Since(t0);
    const auto t1 = Clock::now();
    auto st = (*z)->Step(1e-4f, 1.0f);
    if (!st.ok()) return fail("step", st.status());
    const double in_step = Since(t1);
    const double step = Since(t0);
    loss = 0;
    for (float v : logp) loss -= v;
    if (it < a.warmup) continue;
    sum.step += step;
    sum.compute += compute;
    sum.in_step += in_step;
    sum.comm += timed.TakeSeconds();
    sum.bytes_sent += static_cast<double>(timed.inner().total_bytes().sent);
  }
  // Slowest rank's figures decide the step: take the max over ranks.
  std::vector<float> f = {static_cast<float>(sum.step), static_cast<float>(sum.compute),
                          static_cast<float>(sum.in_step), static_cast<float>(sum.comm)};
  if (absl::Status s = (*z)->Drain(); !s.ok()) return fail("drain", s);
  if (a.workers > 1) {
    if (absl::Status s =
            timed.inner().allreduce(f.data(), f.size(), comm::ReduceOp::kMax, std::chrono::milliseconds(60000));
        !s.ok())
      return fail("report", s);
  }
  if (rank == 0) {
    const double k = a.steps;
    const double step = f[0] / k, compute = f[1] / k, in_step = f[2] / k, comm = f[3] / k;
    const double exposed = std::max(0.0, in_step - adam_s);
    const auto mem = (*z)->memory();
    std::printf(
        "bench_sft config=%s workers=%d stage=%d precision=%s steps=%d (warmup %d) params=%zu "
        "global_batch=%dx%d\n",
        a.config.c_str(), a.workers, a.stage, a.precision.c_str(), a.steps, a.warmup, layout.total_floats(), a.batch,
        a.seq);
    std::printf("  step time        %.3f s  (%.0f tokens/s)\n", step, a.batch * a.seq / step);
    std::printf("  forward+backward %.3f s\n", compute);
    std::printf("  in Step (drain+comm+AdamW) %.3f s, AdamW alone %.3f s\n", in_step, adam_s);
    std::printf(
        "  collective time  %.3f s (%.1f%% of the step; overlapped with compute "
        "for stages 2/3)\n",
        comm, 100 * comm / step);
    std::printf("  exposed comm     %.3f s (%.1f%% of the step)\n", exposed, 100 * exposed / step);
    std::printf("  bytes sent/step  %.1f MB (rank 0)\n", sum.bytes_sent / k / 1e6);
    std::printf(
        "  memory rank 0    params %.1f MB, bf16 compute copy %.1f MB, grads %.1f MB, "
        "optimizer %.1f MB, temporaries %.1f MB\n",
        mem.param_bytes / 1e6, mem.compute_bytes / 1e6, mem.grad_bytes / 1e6, mem.optimizer_bytes / 1e6,
        mem.temp_bytes / 1e6);
    std::printf("  last loss (sum of -logp on rank 0) %.4g\n", loss);
  }
  return 0;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--config")) a.config = next("--config");
    else if (!std::strcmp(argv[i], "--workers")) a.workers = std::atoi(next("--workers"));
    else if (!std::strcmp(argv[i], "--stage")) a.stage = std::atoi(next("--stage"));
    else if (!std::strcmp(argv[i], "--steps")) a.steps = std::atoi(next("--steps"));
    else if (!std::strcmp(argv[i], "--warmup")) a.warmup = std::atoi(next("--warmup"));
    else if (!std::strcmp(argv[i], "--batch")) a.batch = std::atoi(next("--batch"));
    else if (!std::strcmp(argv[i], "--seq")) a.seq = std::atoi(next("--seq"));
    else if (!std::strcmp(argv[i], "--precision")) a.precision = next("--precision");
    else {
      std::fprintf(stderr,
                   "usage: bench_sft [--config B|tiny] [--workers N] [--stage 0-3] "
                   "[--steps K] [--warmup W] [--batch 4] [--seq 512] [--precision fp32|bf16]\n");
      return 2;
    }
  }
  if (a.config != "B" && a.config != "tiny") {
    std::fprintf(stderr, "--config: B or tiny\n");
    return 2;
  }
  if (a.workers < 1 || a.workers > 64 || a.stage < 0 || a.stage > 3 || a.steps < 1 || a.warmup < 0 || a.batch < 1 ||
      a.seq < 1 || a.seq >= 2048) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "bench_sft-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < a.workers; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      const int rc = RunRank(a, dir, r);
      std::fflush(stdout);
      std::_Exit(rc);
    }
    pids.push_back(pid);
  }
  int worst = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, rc);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return worst;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) { return tandem::bench::Main(argc, argv); }
