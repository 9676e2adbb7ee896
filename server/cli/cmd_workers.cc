// tandemctl workers, drain.
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bandwidth.h"
#include "server/cli/cmd_common.h"
#include "server/cli/commands.h"
#include "server/cli/format.h"

namespace tandem::cli {
namespace v1 = tandem::v1;

namespace {
std::string DeviceText(v1::DeviceKind d) {
  std::string n = v1::DeviceKind_Name(d);
  return absl::AsciiStrToLower(n.rfind("DEVICE_KIND_", 0) == 0 ? n.substr(12) : n);
}
}  // namespace

int CmdWorkers(const Args& args) {
  const std::string usage =
      "Usage: tandemctl workers\nLists registered workers and their state (IDLE, BUSY, DRAINING, LOST, GONE).\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::ListWorkersResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return ReportRpcError("workers", s, client->options());
  if (client->options().json) {
    for (const auto& w : resp.workers()) std::cout << ToJson(w) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"ID", "NAME", "HOST", "NODE", "TIER BANDWIDTH", "DEVICE", "MEMORY",
                                                 "SPEED", "STATE", "JOB", "RANK", "HEARTBEAT", "VERSION"}};
  const double now = NowUnix();
  for (const auto& w : resp.workers()) {
    const std::string tiers =
        w.has_tier_bandwidth()
            ? absl::StrCat("intra ", common::FormatBandwidth(w.tier_bandwidth().intra_bytes_per_s()), ", inter ",
                           common::FormatBandwidth(w.tier_bandwidth().inter_bytes_per_s()))
            : "-";
    rows.push_back({w.id(), w.name(), w.host(), w.node().empty() ? "-" : w.node(), tiers,
                    absl::StrCat(DeviceText(w.device()), "x", w.device_count()), FormatBytes(w.memory_bytes()),
                    w.speed() > 0 ? absl::StrFormat("%g", w.speed()) : "-", WorkerStateName(w.state()),
                    w.job_id().empty() ? "-" : w.job_id(), w.job_id().empty() ? "-" : absl::StrCat(w.rank()),
                    w.last_heartbeat() > 0 ? FormatDuration(now - w.last_heartbeat()) + " ago" : "-", w.version()});
  }
  std::cout << Table(rows);
  return kExitOk;
}

int CmdDrain(const Args& args) {
  const std::string usage =
      "Usage: tandemctl drain WORKER\n"
      "Marks a worker (id or name) DRAINING: it finishes its current job and gets no new one.\n";
  int code = 0;
  auto p = ParseOrUsage(args, {}, usage, &code);
  if (!p) return code;
  if (p->positional.size() != 1) {
    std::cerr << "tandemctl: drain needs a worker id or name\n\n" << usage;
    return kExitUsage;
  }
  auto client = MakeClient(*p, &code);
  if (!client) return code;
  v1::DrainWorkerRequest req;
  req.set_worker(p->positional[0]);
  v1::DrainWorkerResponse resp;
  grpc::ClientContext ctx;
  client->Prepare(&ctx);
  grpc::Status s = client->stub().DrainWorker(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("drain", s, client->options());
  if (client->options().json) {
    std::cout << ToJson(resp) << "\n";
  } else {
    std::cout << "worker " << resp.worker().id() << " (" << resp.worker().name()
              << "): " << WorkerStateName(resp.worker().state()) << "\n";
  }
  return kExitOk;
}

}  // namespace tandem::cli
