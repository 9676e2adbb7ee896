// tandemctl events: a job's recorded events, from the first one.
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"
#include "server/cli/job_follow.h"
#include "server/cli/signal_watch.h"

namespace tandem::cli {
namespace v1 = tandem::v1;

int CmdEvents(const Args& args) {
  const std::string usage =
      "Usage: tandemctl events JOB\n"
      "Prints every event recorded for the job, oldest first (one JSON object a line with\n"
      "--output json, else \"[kind] message\"); for a job still running, follows until it ends.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: events needs a job id\n\n" << usage;
    return kExitUsage;
  }
  Canceller cancel;
  SignalWatcher signals([&](int) { cancel.Cancel(); });
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  grpc::ClientContext ctx;
  client->Prepare(&ctx, std::chrono::milliseconds(0));
  cancel.Track(&ctx);
  v1::WatchJobRequest req;
  req.set_job_id(p->positional[0]);
  req.set_from_start(true);
  auto reader = client->stub().WatchJob(&ctx, req);
  v1::JobEvent ev;
  while (reader->Read(&ev)) {
    if (client->options().json) {
      std::cout << ToJson(ev) << "\n" << std::flush;
    } else {
      std::cout << "[" << ev.kind() << "] " << ev.message() << "\n" << std::flush;
    }
  }
  grpc::Status s = reader->Finish();
  cancel.Track(nullptr);
  if (cancel.cancelled()) return kExitCancelled;
  if (!s.ok()) return ReportRpcError("events", s, client->options());
  return kExitOk;
}

}  // namespace tandem::cli
