// tandemctl watch, logs.
#include <grpcpp/grpcpp.h>

#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_follow.h"
#include "server/cli/signal_watch.h"

namespace tandem::cli {
namespace v1 = tandem::v1;

int ExitCodeForJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    default:
      return kExitFailed;
  }
}

int CmdWatch(const Args& args) {
  const std::string usage =
      "Usage: tandemctl watch JOB\n"
      "Follows a job: a live line with step/total, loss or reward, accuracy, KL, tokens/s,\n"
      "elapsed and ETA, plus state changes. Reconnects if the coordinator restarts.\n"
      "Exits with the job's outcome: 0 SUCCEEDED, 1 FAILED, 3 CANCELLED.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: watch needs a job id\n\n" << usage;
    return kExitUsage;
  }
  Canceller cancel;
  SignalWatcher signals([&](int) { cancel.Cancel(); });
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  const bool json = client->options().json;
  ProgressPrinter progress;
  int64_t last_step = INT64_MIN;
  v1::Job final_job;
  grpc::Status s = FollowJob(
      *client, p->positional[0], /*from_start=*/false,
      [&](const v1::Job& job, const v1::JobEvent& ev) {
        if (json) {
          std::cout << ToJson(ev) << "\n" << std::flush;
          return;
        }
        if (ev.kind() == "step" && ev.has_metrics()) {
          if (ev.metrics().step() == last_step) return;
          last_step = ev.metrics().step();
          progress.Step(job, ev.metrics());
        } else if (ev.kind() == "state" || ev.kind() == "worker" || ev.kind() == "recovery" ||
                   ev.kind() == "checkpoint" || ev.kind() == "warm_start") {
          progress.Message(absl::StrCat("[", ev.kind(), "] ", ev.message()));
        }
      },
      &cancel, &final_job);
  progress.Finish();
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::CANCELLED) {
      std::cerr << "tandemctl: watch interrupted (the job keeps running)\n";
      return kExitCancelled;
    }
    return ReportRpcError("watch", s, client->options());
  }
  if (json) {
    std::cout << ToJson(final_job) << "\n";
  } else {
    std::cout << "job " << final_job.id() << " " << StateName(final_job.state())
              << (final_job.reason().empty() ? "" : ": " + final_job.reason()) << " (step " << final_job.step() << "/"
              << final_job.total_steps() << ")\n";
  }
  return ExitCodeForJob(final_job);
}

int CmdLogs(const Args& args) {
  const std::string usage =
      "Usage: tandemctl logs JOB [-f|--follow] [--tail N]\n"
      "Prints the job's log lines (coordinator and workers); -f keeps following until the job ends.\n";
  int code = 0;
  FlagSpec spec{{"tail"}, {"follow"}, {{"f", "follow"}}};
  auto p = ParseOrUsage(args, spec, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: logs needs a job id\n\n" << usage;
    return kExitUsage;
  }
  Canceller cancel;
  SignalWatcher signals([&](int) { cancel.Cancel(); });
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  const bool follow = p->Has("follow");
  const bool json = client->options().json;
  int64_t after = 0;
  bool job_done = false;
  int idle_polls_after_done = 0;
  while (!cancel.cancelled()) {
    v1::GetJobLogsRequest req;
    req.set_job_id(p->positional[0]);
    req.set_after_seq(after);
    req.set_limit(1000);
    v1::GetJobLogsResponse resp;
    grpc::ClientContext ctx;
    client->Prepare(&ctx);
    cancel.Track(&ctx);
    grpc::Status s = client->stub().GetJobLogs(&ctx, req, &resp);
    cancel.Track(nullptr);
    if (!s.ok()) {
      if (cancel.cancelled()) break;
      return ReportRpcError("logs", s, client->options());
    }
    for (const auto& l : resp.lines()) {
      if (json) {
        std::cout << ToJson(l) << "\n";
      } else {
        const time_t t = static_cast<time_t>(l.time());
        struct tm tm_buf;
        gmtime_r(&t, &tm_buf);
        char ts[32];
        strftime(ts, sizeof(ts), "%H:%M:%S", &tm_buf);
        std::cout << ts << " " << l.source() << ": " << l.text() << "\n";
      }
    }
    std::cout << std::flush;
    const bool more = resp.lines_size() > 0 && resp.next_seq() > after;
    if (resp.next_seq() > after) after = resp.next_seq();
    if (more) continue;  // drain what is there first
    if (!follow) break;
    if (job_done && ++idle_polls_after_done >= 1) break;
    // Stop following once the job is over and its last lines are printed.
    v1::GetJobRequest greq;
    greq.set_job_id(p->positional[0]);
    v1::Job job;
    grpc::ClientContext gctx;
    client->Prepare(&gctx);
    if (client->stub().GetJob(&gctx, greq, &job).ok() && IsTerminal(job.state())) job_done = true;
    for (int i = 0; i < 10 && !cancel.cancelled() && !job_done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return kExitOk;
}

}  // namespace tandem::cli
