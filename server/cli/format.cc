#include "server/cli/format.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::cli {
namespace v1 = tandem::v1;

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

std::string WorkerStateName(v1::WorkerState s) {
  std::string n = v1::WorkerState_Name(s);
  return n.rfind("WORKER_STATE_", 0) == 0 ? n.substr(13) : n;
}

std::string KindName(v1::JobKind k) {
  std::string n = v1::JobKind_Name(k);
  return absl::AsciiStrToLower(n.rfind("JOB_KIND_", 0) == 0 ? n.substr(9) : n);
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

double NowUnix() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "-";
  const long long s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string FormatBytes(int64_t b) {
  if (b <= 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  o.add_whitespace = false;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "{}";
  return out;
}

std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w;
  for (const auto& r : rows) {
    if (w.size() < r.size()) w.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string ProgressLine(const v1::Job& job, const v1::StepMetrics& m, double now) {
  std::string line;
  const int64_t total = job.total_steps();
  if (m.step() < 0) {
    line = absl::StrCat("warm-up ", -m.step());
  } else if (total > 0) {
    line = absl::StrCat("step ", m.step(), "/", total);
  } else {
    line = absl::StrCat("step ", m.step());
  }
  if (job.spec().kind() == v1::JOB_KIND_SFT || m.reward_mean() == 0) {
    if (m.loss() != 0) absl::StrAppend(&line, absl::StrFormat("  loss %.4f", m.loss()));
  }
  if (job.spec().kind() != v1::JOB_KIND_SFT && m.step() >= 0) {
    absl::StrAppend(&line, absl::StrFormat("  reward %.3f", m.reward_mean()));
  }
  if (m.accuracy() != 0) absl::StrAppend(&line, absl::StrFormat("  acc %.3f", m.accuracy()));
  if (m.kl() != 0) absl::StrAppend(&line, absl::StrFormat("  kl %.4f", m.kl()));
  if (m.tokens_per_s() > 0) absl::StrAppend(&line, absl::StrFormat("  %.0f tok/s", m.tokens_per_s()));
  if (job.started_at() > 0) {
    const double elapsed = std::max(0.0, now - job.started_at());
    absl::StrAppend(&line, "  elapsed ", FormatDuration(elapsed));
    if (total > 0 && m.step() > 0 && m.step() < total) {
      absl::StrAppend(&line, "  eta ", FormatDuration(elapsed / m.step() * (total - m.step())));
    }
  }
  return line;
}

}  // namespace tandem::cli
