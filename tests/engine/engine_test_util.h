// Test harness for the job engine: N ranks of one job as N JobEngines on N
// threads of this process, rendezvousing through one shared InMemoryStore
// (EngineOptions.store_factory) and talking over real Gloo TCP on 127.0.0.1.
//
// EngineCluster::Run sends the same PhaseCommand to every rank at once (one
// thread per rank, joined before returning) and returns every rank's status
// and report. Each Setup() uses a fresh generation, so a cluster can be set
// up again (e.g. to restore from a checkpoint) without stale store keys.
// SetupMembers sets up a subset of the engines (the survivors of a lost
// worker) as a smaller world; later commands go to those members only.
//
// The shared store records the keys written to it: a test waits for a
// rank to reach a point of its work by the key it writes there
// (EngineCluster::AwaitKey), never by sleeping.
//
// Specs come from YAML through common::ParseJobSpecYaml (defaults and
// validation as for a submitted job file). Use threads_per_worker: 1
// (kernels::MakeCpuOps sets a process-wide thread count).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/phase_failure.h"
#include "tandem/v1/cluster.pb.h"
#include "tests/support/tiny_model.h"
#include "worker/comm/store.h"
#include "worker/engine/engine.h"
#include "worker/model/safetensors.h"

namespace tandem::enginetest {

// Ranks run as threads of one process; when one aborts, a peer's write to
// its closed socket must fail with EPIPE, not kill the test: ignore SIGPIPE
// as tandem-worker does.
inline const bool kSigpipeIgnored = [] {
  signal(SIGPIPE, SIG_IGN);
  return true;
}();

using tandem::v1::JobSpec;
using tandem::v1::Phase;
using tandem::v1::ReportPhaseRequest;

struct RankResult {
  absl::Status status;
  ReportPhaseRequest report;
};

// The tiny model (tests/support/tiny_model.yaml) on 2-digit addition.
inline std::string TinySftYaml() {
  return R"(
name: engine-test
kind: sft
seed: 11
model:
  config: )" +
         ::tandem::testing::TinyModelFlowMap() + R"(
task: {name: arithmetic, op: add, digits: 2, eval_size: 24}
train: {steps: 20, lr: 3.0e-3, global_batch: 12, micro_batch: 2, warmup_steps: 2, seq_len: 16}
cluster: {workers: 1, zero_stage: 0, threads_per_worker: 1}
checkpoint: {every: 0, keep: 3}
)";
}

// A tiny GRPO job (1-digit addition, KL term on) on the same model.
inline std::string TinyGrpoYaml() {
  return R"(
name: engine-grpo-test
kind: grpo
seed: 5
model:
  config: )" +
         ::tandem::testing::TinyModelFlowMap() + R"(
task: {name: arithmetic, op: add, digits: 1, eval_size: 16, format_reward: 0.5}
train: {steps: 20, lr: 3.0e-3, global_batch: 16, micro_batch: 4, warmup_steps: 0, seq_len: 16}
rl: {group_size: 4, prompts_per_step: 4, max_new_tokens: 4, kl_coef: 0.01, temperature: 1.0}
init: {sft: {steps: 0}}
cluster: {workers: 1, zero_stage: 0, threads_per_worker: 1}
)";
}

inline JobSpec ParseSpec(const std::string& yaml, const std::vector<std::string>& overrides) {
  auto spec = common::ParseJobSpecYaml(yaml, overrides);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// A fresh directory under the test temp dir (removed by the caller or left
// for ctest's temp cleanup).
inline std::string MakeTempDir(const std::string& tag) {
  std::string tmpl = ::testing::TempDir() + "/tandem-engine-" + tag + "-XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  EXPECT_NE(made, nullptr);
  return tmpl;
}

// An InMemoryStore that remembers every key written (Set, Add), so a test
// can wait for one. Thread-safe.
class ObservedStore final : public comm::Store {
 public:
  absl::Status Set(std::string_view key, std::string_view value) override {
    absl::Status s = base_.Set(key, value);
    Note(key);
    return s;
  }
  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override {
    return base_.Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    auto r = base_.Add(key, delta);
    Note(key);
    return r;
  }
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return base_.Wait(keys, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override { return base_.Delete(key); }
  // Waits up to `timeout` until a key that starts with `prefix` and ends
  // with `suffix` has been written; false when none was.
  bool AwaitKey(const std::string& prefix, const std::string& suffix, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::any_of(written_.begin(), written_.end(), [&](const std::string& k) {
        return absl::StartsWith(k, prefix) && absl::EndsWith(k, suffix);
      });
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), timeout);
  }

 private:
  void Note(std::string_view key) {
    absl::MutexLock lock(&mu_);
    written_.emplace_back(key);
  }
  comm::InMemoryStore base_;
  absl::Mutex mu_;
  std::vector<std::string> written_ ABSL_GUARDED_BY(mu_);
};

class EngineCluster {
 public:
  // `device`: the engines' EngineOptions.device (cpu | cpu-guarded | cuda).
  // `speeds`: each engine's EngineOptions.speed (tandem-worker --speed);
  // empty = none.
  explicit EngineCluster(int world, std::string job_id = "job-1", std::string device = "cpu",
                         std::vector<double> speeds = {})
      : world_(world), job_id_(std::move(job_id)) {
    for (int r = 0; r < world_; ++r) {
      worker::EngineOptions o;
      o.device = device;
      if (static_cast<size_t>(r) < speeds.size()) o.speed = speeds[r];
      o.worker_id = absl::StrCat("w", r);  // not "w" + to_string: GCC 12 -Wrestrict false positive
      o.num_threads = 1;
      o.collective_timeout_ms = 30000;
      o.store_factory = [this](const std::string& job, int64_t gen) -> absl::StatusOr<std::unique_ptr<comm::Store>> {
        return std::unique_ptr<comm::Store>(new comm::PrefixStore(job + "/" + std::to_string(gen), &store_));
      };
      engines_.push_back(worker::MakeJobEngine(o));
      active_.push_back(r);
    }
  }
  ~EngineCluster() {
    active_.clear();
    for (int r = 0; r < world_; ++r) active_.push_back(r);
    Run(tandem::v1::PHASE_TEARDOWN, 0);
  }

  int world() const { return world_; }
  int64_t generation() const { return generation_; }
  worker::JobEngine& engine(int r) { return *engines_[r]; }
  // Waits (bounded) until a rank of `job` at `generation` wrote a store key
  // ending with `suffix`.
  bool AwaitKey(const std::string& job, int64_t generation, const std::string& suffix,
                absl::Duration timeout = absl::Seconds(30)) {
    return store_.AwaitKey(job + "/" + std::to_string(generation) + "/", suffix, timeout);
  }

  // PHASE_SETUP on every rank with a new generation.
  std::vector<RankResult> Setup(const JobSpec& spec, const std::string& restore_from = "",
                                const std::string& run_dir = "") {
    ++generation_;
    active_.clear();
    for (int r = 0; r < world_; ++r) active_.push_back(r);
    std::vector<tandem::v1::PhaseCommand> cmds(world_);
    for (int r = 0; r < world_; ++r) {
      auto& c = cmds[r];
      Fill(c, tandem::v1::PHASE_SETUP, 0);
      auto* a = c.mutable_assignment();
      a->set_job_id(job_id_);
      *a->mutable_spec() = spec;
      a->mutable_spec()->mutable_cluster()->set_workers(world_);
      a->set_rank(r);
      a->set_world_size(world_);
      a->set_generation(generation_);
      a->set_restore_from(restore_from);
      a->set_run_dir(run_dir);
    }
    return RunCommands(cmds);
  }

  // PHASE_SETUP with a new generation on the engines `members` (indices),
  // as ranks 0..members.size()-1 of that world; cluster.workers stays as in
  // `spec`. `edit(rank, assignment)` adds what the test needs (e.g. a live
  // restore). Later commands go to these members only.
  std::vector<RankResult> SetupMembers(const JobSpec& spec, const std::vector<int>& members,
                                       const std::function<void(int, tandem::v1::Assignment&)>& edit = nullptr) {
    ++generation_;
    active_ = members;
    const int n = static_cast<int>(members.size());
    std::vector<tandem::v1::PhaseCommand> cmds(n);
    for (int r = 0; r < n; ++r) {
      auto& c = cmds[r];
      Fill(c, tandem::v1::PHASE_SETUP, 0);
      auto* a = c.mutable_assignment();
      a->set_job_id(job_id_);
      *a->mutable_spec() = spec;
      a->set_rank(r);
      a->set_world_size(n);
      a->set_generation(generation_);
      if (edit) edit(r, *a);
    }
    return RunCommands(cmds);
  }

  // The engines the next commands go to.
  const std::vector<int>& members() const { return active_; }

  std::vector<RankResult> Run(Phase phase, int64_t step) {
    std::vector<tandem::v1::PhaseCommand> cmds(active_.size());
    for (auto& c : cmds) Fill(c, phase, step);
    return RunCommands(cmds);
  }

  // Runs `phase` and expects success on every rank; returns rank 0's report.
  ReportPhaseRequest RunOk(Phase phase, int64_t step) {
    auto res = Run(phase, step);
    for (size_t r = 0; r < res.size(); ++r) {
      EXPECT_TRUE(res[r].status.ok()) << tandem::v1::Phase_Name(phase) << " step " << step << " rank " << r << ": "
                                      << res[r].status;
    }
    return res[0].report;
  }

  ReportPhaseRequest SetupOk(const JobSpec& spec, const std::string& restore_from = "",
                             const std::string& run_dir = "") {
    auto res = Setup(spec, restore_from, run_dir);
    for (int r = 0; r < world_; ++r) {
      EXPECT_TRUE(res[r].status.ok()) << "SETUP rank " << r << ": " << res[r].status;
    }
    return res[0].report;
  }

 private:
  void Fill(tandem::v1::PhaseCommand& c, Phase phase, int64_t step) {
    c.set_command_id("cmd-" + std::to_string(++command_));
    c.set_job_id(job_id_);
    c.set_generation(generation_);
    c.set_phase(phase);
    c.set_step(step);
  }

  // cmds[i] goes to engine active_[i].
  std::vector<RankResult> RunCommands(const std::vector<tandem::v1::PhaseCommand>& cmds) {
    std::vector<RankResult> out(cmds.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < cmds.size(); ++r) {
      threads.emplace_back([&, r] { out[r].status = engines_[active_[r]]->RunPhase(cmds[r], &out[r].report); });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  const int world_;
  const std::string job_id_;
  ObservedStore store_;
  std::vector<std::unique_ptr<worker::JobEngine>> engines_;
  std::vector<int> active_;  // engines the commands go to (rank i = active_[i])
  int64_t generation_ = 0;
  int64_t command_ = 0;
};

// Loads the exported model's flat fp32 parameters.
inline std::vector<float> LoadExported(const std::string& dir) {
  auto m = model::LoadModelDir(dir);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? m->params : std::vector<float>();
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

inline double RelDiff(double a, double b) {
  const double scale = std::max(std::fabs(a), std::fabs(b));
  return scale == 0 ? 0 : std::fabs(a - b) / scale;
}

inline bool HasLine(const ReportPhaseRequest& r, const std::string& needle) {
  for (const auto& l : r.log_lines()) {
    if (l.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace tandem::enginetest
