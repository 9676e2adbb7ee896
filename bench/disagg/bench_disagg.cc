// bench_disagg: one GRPO job file run through the real job engine in three
// placements - co-located on N workers, disaggregated sync and async (R
// rollout + T trainer workers) - with every worker a JobEngine on its own
// thread (Gloo over 127.0.0.1, rendezvous through an in-memory store), phases
// issued like the coordinator does (each to every rank, wait for all).
// Prints per-phase wall time per step, the switch share (co-located: enter +
// leave rollout; disaggregated: SYNC_WEIGHTS), rollout and update tokens/s and
// the staleness figures.
//
//   bench_disagg --config configs/grpo-arith-tiny.yaml --steps 8 --warm 0
//                [--workers 2] [--rollout 1 --train 1] [--staleness 1]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/job_spec.h"
#include "worker/comm/store.h"
#include "worker/engine/engine.h"

namespace {

using tandem::v1::Phase;
using tandem::v1::ReportPhaseRequest;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string config = "configs/grpo-arith-tiny.yaml";
  int steps = 8, warm = 0, workers = 2, rollout = 1, train = 1, staleness = 1;
};

class Cluster {
 public:
  Cluster(int world, const std::string& job) : world_(world), job_(job) {
    for (int r = 0; r < world; ++r) {
      tandem::worker::EngineOptions o;
      o.worker_id = "w" + std::to_string(r);
      o.num_threads = 1;
      o.collective_timeout_ms = 300000;
      o.store_factory = [this](const std::string& j,
                               int64_t g) -> absl::StatusOr<std::unique_ptr<tandem::comm::Store>> {
        return std::unique_ptr<tandem::comm::Store>(
            new tandem::comm::PrefixStore(j + "/" + std::to_string(g), &store_));
      };
      engines_.push_back(tandem::worker::MakeJobEngine(o));
    }
  }
  // Runs the phase on every rank; returns rank 0's report and the wall time.
  ReportPhaseRequest Run(Phase phase, int64_t step, double* wall, const tandem::v1::JobSpec* spec = nullptr) {
    std::vector<ReportPhaseRequest> reps(world_);
    std::vector<absl::Status> sts(world_);
    std::vector<std::thread> th;
    const auto t0 = Clock::now();
    ++cmd_;
    for (int r = 0; r < world_; ++r) {
      th.emplace_back([&, r] {
        tandem::v1::PhaseCommand c;
        c.set_command_id("c" + std::to_string(cmd_));
        c.set_job_id(job_);
        c.set_generation(1);
        c.set_phase(phase);
        c.set_step(step);
        if (spec != nullptr) {
          auto* a = c.mutable_assignment();
          a->set_job_id(job_);
          *a->mutable_spec() = *spec;
          a->set_rank(r);
          a->set_world_size(world_);
          a->set_generation(1);
        }
        sts[r] = engines_[r]->RunPhase(c, &reps[r]);
      });
    }
    for (auto& t : th) t.join();
    if (wall != nullptr) *wall = std::chrono::duration<double>(Clock::now() - t0).count();
    for (int r = 0; r < world_; ++r) {
      if (!sts[r].ok()) {
        std::fprintf(stderr, "%s step %lld rank %d: %s\n", tandem::v1::Phase_Name(phase).c_str(),
                     static_cast<long long>(step), r, sts[r].ToString().c_str());
        std::exit(1);
      }
    }
    return reps[0];
  }

 private:
  int world_;
  std::string job_;
  tandem::comm::InMemoryStore store_;
  std::vector<std::unique_ptr<tandem::worker::JobEngine>> engines_;
  int cmd_ = 0;
};

double Extra(const ReportPhaseRequest& r, const char* key) {
  auto it = r.metrics().extra().find(key);
  return it == r.metrics().extra().end() ? 0 : it->second;
}

void RunMode(const Args& a, const std::string& yaml, const std::string& mode) {
  std::vector<std::string> ov = {"train.steps=" + std::to_string(a.steps), "init.sft.steps=" + std::to_string(a.warm),
                                 "train.eval_every=0", "checkpoint.every=0"};
  int world = a.workers;
  if (mode != "colocated") {
    world = a.rollout + a.train;
    ov.insert(ov.end(), {"placement.mode=disaggregated", "placement.rollout_workers=" + std::to_string(a.rollout),
                         "placement.train_workers=" + std::to_string(a.train), "placement.coupling=" + mode,
                         "placement.max_staleness=" + std::to_string(mode == "async" ? a.staleness : 0)});
  }
  ov.push_back("cluster.workers=" + std::to_string(world));
  auto spec = tandem::common::ParseJobSpecYaml(yaml, ov);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s: %s\n", mode.c_str(), spec.status().ToString().c_str());
    std::exit(2);
  }
  Cluster c(world, "bench-" + mode);
  c.Run(tandem::v1::PHASE_SETUP, 0, nullptr, &*spec);
  for (int w = 1; w <= a.warm; ++w) c.Run(tandem::v1::PHASE_SFT_STEP, -w, nullptr);
  std::map<std::string, double> phase_s;
  double step_s = 0, switch_s = 0, rtok = 0, rgen_tps = 0, utok = 0, stale_max = 0, stale_sum = 0, dropped = 0;
  double reward = 0;
  const int skip = 1;  // first step warms caches and (async) has nothing to overlap
  for (int s = 1; s <= a.steps; ++s) {
    const bool count = s > skip;
    std::vector<Phase> phases = {tandem::v1::PHASE_ROLLOUT, tandem::v1::PHASE_SCORE, tandem::v1::PHASE_LOGPROBS,
                                 tandem::v1::PHASE_UPDATE};
    if (mode != "colocated") phases.insert(phases.begin(), tandem::v1::PHASE_SYNC_WEIGHTS);
    for (Phase p : phases) {
      double wall = 0;
      auto rep = c.Run(p, s, &wall);
      if (!count) continue;
      std::string name = tandem::v1::Phase_Name(p).substr(6);
      phase_s[name] += wall;
      step_s += wall;
      if (p == tandem::v1::PHASE_ROLLOUT) {
        switch_s += rep.metrics().switch_seconds();
        rtok += Extra(rep, "rollout_tokens");
        rgen_tps += Extra(rep, "rollout_tokens_per_s");
        stale_max = std::max(stale_max, Extra(rep, "staleness_max"));
        stale_sum += Extra(rep, "staleness_mean");
        dropped += Extra(rep, "trajectories_dropped");
      }
      if (p == tandem::v1::PHASE_SYNC_WEIGHTS) switch_s += wall;
      if (p == tandem::v1::PHASE_SCORE) reward += rep.metrics().reward_mean();
      if (p == tandem::v1::PHASE_UPDATE) utok += rep.metrics().tokens_per_s();
    }
  }
  const int n = a.steps - skip;
  std::printf("%-9s world %d: step %.3f s |", mode.c_str(), world, step_s / n);
  for (const auto& [name, v] : phase_s) std::printf(" %s %.3f", name.c_str(), v / n);
  std::printf(
      " | switch %.3f s (%.1f%%) | rollout %.0f tok/step, %.0f tok/s generating, %.0f tok/s of step | "
      "update %.0f tok/s | staleness max %.0f mean %.2f, dropped %.0f | reward %.3f\n",
      switch_s / n, 100 * switch_s / step_s, rtok / n, rgen_tps / n, rtok / step_s, utok / n, stale_max, stale_sum / n,
      dropped, reward / n);
  std::fflush(stdout);
  c.Run(tandem::v1::PHASE_TEARDOWN, 0, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::vector<std::string> modes;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") a.config = v;
    else if (k == "--steps") a.steps = std::atoi(v.c_str());
    else if (k == "--warm") a.warm = std::atoi(v.c_str());
    else if (k == "--workers") a.workers = std::atoi(v.c_str());
    else if (k == "--rollout") a.rollout = std::atoi(v.c_str());
    else if (k == "--train") a.train = std::atoi(v.c_str());
    else if (k == "--staleness") a.staleness = std::atoi(v.c_str());
    else if (k == "--mode") modes.push_back(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (a.steps < 2) a.steps = 2;
  if (modes.empty()) modes = {"colocated", "sync", "async"};
  FILE* f = std::fopen(a.config.c_str(), "r");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", a.config.c_str());
    return 2;
  }
  std::string yaml;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) yaml.append(buf, n);
  std::fclose(f);
  for (const auto& m : modes) RunMode(a, yaml, m);
  return 0;
}
