#include "server/cli/local_run_report.h"

#include <algorithm>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "server/cli/format.h"

namespace tandem::cli {
namespace v1 = tandem::v1;
namespace fs = std::filesystem;

namespace {

// Why a worker that exited stays down, for the summary.
std::string WhyNotRestarted(const SupervisorEvent& e) {
  if (e.kind == SupervisorEvent::Kind::kGaveUp) return absl::StrCat("all ", e.max_restarts, " restarts used");
  if (e.note == "--no-restart") return "restarts are off (--no-restart)";
  return e.note;
}

}  // namespace

void RunEvents::Supervisor(const SupervisorEvent& e) {
  using Kind = SupervisorEvent::Kind;
  nlohmann::json j;
  j["time"] = e.time;
  j["source"] = "tandemctl";
  j["kind"] = e.kind == Kind::kRestarted       ? "restart"
              : e.kind == Kind::kRestartFailed ? "restart_failed"
              : e.kind == Kind::kGaveUp        ? "restart_limit"
                                               : "worker_exit";
  j["worker"] = e.member;
  j["reason"] = e.reason;
  if (e.kind != Kind::kExited) {
    j["restart"] = e.restart;
    j["max_restarts"] = e.max_restarts;
  }
  if (e.kind == Kind::kRestarted) j["pid"] = e.pid;
  if (!e.error.empty()) j["error"] = e.error;
  if (!e.note.empty()) j["note"] = e.note;
  const std::string text = DescribeEvent(e);
  j["message"] = text;
  Write(j, absl::StrCat(e.kind == Kind::kExited ? "[worker] " : "[restart] ", text), /*always=*/true);
}

void RunEvents::Job(const v1::JobEvent& ev) {
  nlohmann::json j;
  j["time"] = ev.time();
  j["source"] = "coordinator";
  j["kind"] = ev.kind();
  j["message"] = ev.message();
  if (ev.state() != v1::JOB_STATE_UNSPECIFIED) j["state"] = StateName(ev.state());
  Write(j, absl::StrCat("[", ev.kind(), "] ", ev.message()), /*always=*/false);
}

void RunEvents::Write(const nlohmann::json& j, const std::string& line, bool always) {
  absl::MutexLock lock(&mu_);
  out_ << j.dump() << "\n" << std::flush;
  if (!json_) {
    progress_->Message(line);
  } else if (always) {
    std::cerr << "tandemctl: " << line << "\n";
  }
}

TensorBoardScalars::TensorBoardScalars(const fs::path& dir) {
  auto log = TensorBoardLog::Create(dir);
  if (log.ok()) {
    log_ = std::move(*log);
  } else {
    Warn(log.status());
  }
}

void TensorBoardScalars::Record(const nlohmann::json& step) {
  if (!log_) return;
  if (absl::Status st = log_->Record(step); !st.ok()) {
    Warn(st);
    log_.reset();
  }
}

void TensorBoardScalars::Warn(const absl::Status& st) {
  std::cerr << "tandemctl: warning: no TensorBoard events for this run: " << st.message() << "\n";
}

// Merges a later report of the same step into an earlier one (EVAL adds accuracy).
void MergeStep(v1::StepMetrics* into, const v1::StepMetrics& from) {
  v1::StepMetrics merged = *into;
  merged.MergeFrom(from);  // proto3 scalars: non-zero values of `from` win
  *into = merged;
}

nlohmann::json StepJson(const v1::StepMetrics& m) {
  nlohmann::json j = nlohmann::json::parse(ToJson(m), nullptr, false);
  if (j.is_discarded()) return nlohmann::json::object();
  // Proto JSON writes int64 as strings; metrics.jsonl wants numbers.
  for (const char* key : {"step", "peak_memory_bytes"}) {
    if (j.contains(key) && j[key].is_string()) {
      try {
        j[key] = std::stoll(j[key].get<std::string>());
      } catch (...) {
      }
    }
  }
  return j;
}

void PrintSummary(const v1::Job& job, const std::map<int64_t, v1::StepMetrics>& steps, const fs::path& dir,
                  double wall_seconds, const std::vector<SupervisorEvent>& restarts,
                  const std::vector<SupervisorEvent>& down, bool json_output) {
  nlohmann::json s;
  s["job_id"] = job.id();
  s["name"] = job.spec().name();
  s["kind"] = common::KindName(job.spec().kind());
  s["state"] = StateName(job.state());
  s["reason"] = job.reason();
  s["steps"] = job.step();
  s["total_steps"] = job.total_steps();
  s["workers"] = job.spec().cluster().workers();
  s["wall_seconds"] = wall_seconds;
  double final_loss = 0, final_reward = 0, acc_before = -1, acc_after = -1, tokens = 0, switch_s = 0, phase_total = 0;
  int tok_n = 0;
  std::map<std::string, double> phases;
  bool has_reward = false;
  std::vector<double> rewards;  // RL steps in order, for the reward curve
  for (const auto& [step, m] : steps) {
    if (step > 0 && job.spec().kind() != v1::JOB_KIND_SFT) rewards.push_back(m.reward_mean());
    if (m.loss() != 0) final_loss = m.loss();
    if (step > 0 && job.spec().kind() != v1::JOB_KIND_SFT) {
      final_reward = m.reward_mean();
      has_reward = true;
    }
    const bool has_acc = m.accuracy() != 0 || m.extra().count("eval") > 0 || m.extra().count("accuracy") > 0;
    if (has_acc) {
      if (acc_before < 0) acc_before = m.accuracy();
      acc_after = m.accuracy();
    }
    if (m.extra().count("accuracy_before") > 0) acc_before = m.extra().at("accuracy_before");
    if (m.tokens_per_s() > 0) {
      tokens += m.tokens_per_s();
      ++tok_n;
    }
    switch_s += m.switch_seconds();
    for (const auto& [k, v] : m.phase_seconds()) {
      phases[k] += v;
      phase_total += v;
    }
  }
  // Reward curve: the mean reward of (up to) 10 equal spans of RL steps.
  std::vector<double> curve;
  const size_t spans = std::min<size_t>(10, rewards.size());
  for (size_t i = 0; i < spans; ++i) {
    const size_t b = i * rewards.size() / spans, e = (i + 1) * rewards.size() / spans;
    double sum = 0;
    for (size_t j = b; j < e; ++j) sum += rewards[j];
    curve.push_back(e > b ? sum / static_cast<double>(e - b) : 0);
  }
  if (!curve.empty()) s["reward_curve"] = curve;
  s["final_loss"] = final_loss;
  if (has_reward) s["final_reward"] = final_reward;
  if (acc_before >= 0) s["accuracy_before"] = acc_before;
  if (acc_after >= 0) s["accuracy_after"] = acc_after;
  s["phase_seconds"] = phases;
  if (tok_n > 0) s["mean_tokens_per_s"] = tokens / tok_n;
  if (switch_s > 0 && phase_total > 0) s["switch_share"] = switch_s / phase_total;
  s["worker_restarts"] = nlohmann::json::array();
  for (const auto& r : restarts) {
    s["worker_restarts"].push_back(
        {{"worker", r.member}, {"reason", r.reason}, {"time", r.time}, {"restart", r.restart}, {"pid", r.pid}});
  }
  // Workers that exited during the job and were not restarted.
  for (const auto& d : down) {
    s["workers_not_restarted"].push_back({{"worker", d.member}, {"reason", d.reason}, {"why", WhyNotRestarted(d)}});
  }
  s["output_dir"] = (dir / "final").string();
  s["metrics"] = (dir / "metrics.jsonl").string();
  s["events"] = (dir / "events.jsonl").string();
  std::ofstream(dir / "summary.json") << s.dump(2) << "\n";
  if (json_output) {
    std::cout << s.dump() << "\n";
    return;
  }
  std::cout << "\n== " << job.spec().name() << " (job " << job.id() << "): " << StateName(job.state())
            << (job.reason().empty() ? "" : " - " + job.reason()) << "\n";
  std::cout << absl::StrFormat(
      "steps        %d/%d in %s (%d worker(s), %s)\n", job.step(), job.total_steps(),
      wall_seconds < 60 ? absl::StrFormat("%.1f s", wall_seconds) : FormatDuration(wall_seconds),
      job.spec().cluster().workers(), common::DeviceName(job.spec().cluster().device()));
  if (final_loss != 0) std::cout << absl::StrFormat("final loss   %.4f\n", final_loss);
  if (has_reward) std::cout << absl::StrFormat("final reward %.4f\n", final_reward);
  if (acc_before >= 0) std::cout << absl::StrFormat("accuracy     %.3f -> %.3f\n", acc_before, acc_after);
  if (!curve.empty()) {
    std::cout << absl::StrFormat("reward curve (mean of %zu spans of ~%zu steps):", curve.size(),
                                 rewards.size() / curve.size());
    for (double r : curve) std::cout << absl::StrFormat(" %.2f", r);
    std::cout << "\n";
  }
  if (tok_n > 0) std::cout << absl::StrFormat("tokens/s     %.0f (mean over steps)\n", tokens / tok_n);
  if (!phases.empty()) {
    std::cout << "time/phase  ";
    for (const auto& [k, v] : phases) {
      std::cout << absl::StrFormat(" %s %.2fs (%.0f%%)", k, v, phase_total > 0 ? 100 * v / phase_total : 0);
    }
    std::cout << "\n";
  }
  if (switch_s > 0 && phase_total > 0) {
    std::cout << absl::StrFormat("switch share %.1f%% of phase time (%.2f s)\n", 100 * switch_s / phase_total,
                                 switch_s);
  }
  if (!restarts.empty()) {
    std::vector<std::string> items;
    for (const auto& r : restarts) items.push_back(absl::StrCat(r.member, " (", r.reason, ")"));
    if (items.size() > 4) {
      items.resize(4);
      items.push_back("...");
    }
    std::cout << "restarts     " << restarts.size() << ": " << absl::StrJoin(items, ", ") << "\n";
  }
  for (const auto& d : down) {
    std::cout << "not restarted " << d.member << " (" << d.reason << "): " << WhyNotRestarted(d) << "\n";
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) std::cout << "model        " << (dir / "final").string() << "\n";
  std::cout << "metrics      " << (dir / "metrics.jsonl").string() << "\n"
            << "events       " << (dir / "events.jsonl").string() << "\n"
            << "logs         " << (dir / "coordinator.log").string() << ", " << (dir / "worker-*.log").string() << "\n";
}

}  // namespace tandem::cli
