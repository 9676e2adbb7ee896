// Fuzz target: every unary RPC of the coordinator (server/api/control_service.h,
// server/api/cluster_service.h), called in process on the real handlers with a
// default-constructed grpc::ServerContext and a request parsed from the
// input, as gRPC hands one over after decoding the wire bytes.
//
// Each input runs against a fresh coordinator (state store, membership, kv
// store, job manager and both services; no gRPC server, scheduler or driver
// threads, and a manual clock) loaded from a copy of one state database,
// seeded once with:
//   j-000001  RUNNING, generation 1, worker w-1 at rank 0
//   j-000002  PENDING
//   j-000003  SUCCEEDED
//   w-1 BUSY in j-000001, w-2 IDLE (both with known credentials), w-3 LOST
// so calls get past authentication and the credential checks into the
// managers (reports for a running job, its rendezvous store scope).
//
// Input: up to 8 calls, each [selector][length: 2 bytes, little endian]
// [request: protobuf wire format]; a request cut short by the end of the
// input is what is left. Selector bits 0-3 pick the RPC (Dispatch), bits
// 4-6 who calls (kCallers). A credential from a RegisterWorker answer is
// presented by later calls of caller 2. Timeouts in requests are cut to
// 1 ms so nothing waits.
//
// Left out: the streaming RPCs Attach and WatchJob. Their handlers loop
// writing to a grpc::ServerWriter until the client goes away (Attach: until
// cancelled; WatchJob: until the job ends), and a ServerWriter cannot be
// made without a live call; their request checks are the same CheckId calls
// as GetJob's and Heartbeat's.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/test/server_context_test_spouse.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "common/auth.h"
#include "common/daemon_config.h"
#include "common/job_spec.h"
#include "server/api/cluster_service.h"
#include "server/api/control_service.h"
#include "server/clock.h"
#include "server/jobs/job_manager.h"
#include "server/membership/membership.h"
#include "server/store/kv_store.h"
#include "server/store/state_store.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fixtures.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::fuzz {
namespace {

namespace v1 = tandem::v1;
using server::ClusterService;
using server::ControlService;

constexpr char kAdminToken[] = "fuzz-admin-token";
constexpr char kJoinToken[] = "fuzz-join-token";
constexpr char kCredential1[] = "fuzz-credential-of-w-1";
constexpr char kCredential2[] = "fuzz-credential-of-w-2";
constexpr int kMaxCalls = 8;
// ClusterService's limit on StoreGet/StoreWait timeouts: larger values are
// kept (refused by the handler), smaller ones cut to 1 ms.
constexpr int64_t kMaxStoreTimeoutMs = 30 * 60 * 1000;

absl::Status Seed(server::StateStore* store) {
  const std::string runs_dir = kFixtureRunsDir;
  auto spec = common::ParseJobSpecYaml(kFixtureJobYaml);
  if (!spec.ok()) return spec.status();
  const v1::JobState states[] = {v1::JOB_STATE_RUNNING, v1::JOB_STATE_PENDING, v1::JOB_STATE_SUCCEEDED};
  for (v1::JobState state : states) {
    auto seq = store->NextJobSeq();
    if (!seq.ok()) return seq.status();
    v1::Job job;
    job.set_id(absl::StrFormat("j-%06d", *seq));
    *job.mutable_spec() = *spec;
    job.mutable_spec()->set_output_dir(runs_dir + "/" + job.id() + "/final");
    job.mutable_spec()->mutable_checkpoint()->set_dir(runs_dir + "/" + job.id() + "/checkpoints");
    job.set_state(state);
    job.set_total_steps(spec->train().steps());
    job.set_output_dir(job.spec().output_dir());
    server::PhaseCursor cursor;
    if (state == v1::JOB_STATE_RUNNING) {
      job.set_generation(1);
      job.add_worker_ids("w-1");
      job.set_step(1);
      cursor = {2, 0};
    }
    if (absl::Status st = store->PutJob(job, cursor, *seq); !st.ok()) return st;
  }
  auto worker = [](const std::string& id, v1::WorkerState state) {
    v1::WorkerInfo w;
    w.set_id(id);
    w.set_name("host-" + id);
    w.set_host("127.0.0.1");
    w.set_device(v1::DEVICE_KIND_CPU);
    w.set_state(state);
    return w;
  };
  v1::WorkerInfo w1 = worker("w-1", v1::WORKER_STATE_BUSY);
  w1.set_job_id("j-000001");
  w1.set_rank(0);
  if (absl::Status st = store->PutWorker(w1, common::CredentialDigest(kCredential1)); !st.ok()) return st;
  if (absl::Status st = store->PutWorker(worker("w-2", v1::WORKER_STATE_IDLE), common::CredentialDigest(kCredential2));
      !st.ok()) {
    return st;
  }
  return store->PutWorker(worker("w-3", v1::WORKER_STATE_LOST));
}

// The coordinator's managers and services as server/coordinator.cc wires
// them, minus the gRPC server and the threads.
class InProcessCoordinator {
 public:
  // A fresh one under dir (emptied first) whose coordinator.db holds
  // seeded_db (the bytes of one); empty = seed a new state instead.
  static std::unique_ptr<InProcessCoordinator> Create(const std::string& dir, const std::string& seeded_db) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    std::filesystem::create_directories(dir + "/state", ec);
    if (ec) Fail("cannot prepare " + dir + ": " + ec.message());
    if (!seeded_db.empty()) WriteFileOrDie(dir + "/state/coordinator.db", seeded_db);
    auto c = std::unique_ptr<InProcessCoordinator>(new InProcessCoordinator);
    c->config_ = common::DefaultCoordinatorConfig();
    c->config_.set_state_dir(dir + "/state");
    c->config_.set_runs_dir(dir + "/runs");
    auto store = server::StateStore::Open(c->config_.state_dir());
    if (!store.ok()) Fail("StateStore::Open: " + store.status().ToString());
    c->store_ = *std::move(store);
    if (seeded_db.empty()) {
      if (absl::Status st = Seed(c->store_.get()); !st.ok()) Fail("seed: " + st.ToString());
    }
    c->auth_ = std::make_unique<common::TokenAuthenticator>(kAdminToken, kJoinToken, false);
    c->membership_ = std::make_unique<server::Membership>(c->config_, c->store_.get(), &c->clock_);
    if (absl::Status st = c->membership_->Load(); !st.ok()) Fail("Membership::Load: " + st.ToString());
    c->jobs_ =
        std::make_unique<server::JobManager>(c->config_, c->store_.get(), c->membership_.get(), &c->kv_, &c->clock_);
    if (absl::Status st = c->jobs_->Load(); !st.ok()) Fail("JobManager::Load: " + st.ToString());
    c->control_ = std::make_unique<ControlService>(c->jobs_.get(), c->membership_.get(), c->auth_.get(), &c->stopping_);
    c->cluster_ = std::make_unique<ClusterService>(c->config_, c->jobs_.get(), c->membership_.get(), &c->kv_,
                                                   c->auth_.get(), &c->stopping_);
    return c;
  }

  ControlService* control() { return control_.get(); }
  ClusterService* cluster() { return cluster_.get(); }

 private:
  InProcessCoordinator() = default;

  // Declared in construction order; destroyed in reverse.
  v1::CoordinatorConfig config_;
  server::ManualClock clock_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<server::StateStore> store_;
  std::unique_ptr<common::TokenAuthenticator> auth_;
  std::unique_ptr<server::Membership> membership_;
  server::KvStore kv_;
  std::unique_ptr<server::JobManager> jobs_;
  std::unique_ptr<ControlService> control_;
  std::unique_ptr<ClusterService> cluster_;
};

// Who calls: the metadata a call carries.
struct Caller {
  const char* token;       // nullptr: no authorization metadata
  const char* credential;  // nullptr: none; "" : the last registered worker's (else w-2's)
};
constexpr std::array<Caller, 8> kCallers = {{
    {kAdminToken, kCredential1},
    {kJoinToken, kCredential1},
    {kJoinToken, ""},
    {kJoinToken, kCredential2},
    {kAdminToken, nullptr},
    {nullptr, nullptr},
    {"not-a-token", nullptr},
    {kJoinToken, "not-a-credential"},
}};

struct Session {
  InProcessCoordinator* coordinator;
  std::string registered_credential;  // from the last RegisterWorker answer
};

// Parses the request and calls the handler as `caller`. Bytes that are not
// a request go no further: gRPC refuses them before any handler runs.
template <typename Service, typename Request, typename Response>
void Call(Session* session, Service* service,
          grpc::Status (Service::*handler)(grpc::ServerContext*, const Request*, Response*), const Caller& caller,
          const uint8_t* bytes, size_t size) {
  Request request;
  if (!request.ParseFromArray(bytes, static_cast<int>(size))) return;
  if constexpr (std::is_same_v<Request, v1::StoreGetRequest> || std::is_same_v<Request, v1::StoreWaitRequest>) {
    if (request.timeout_ms() > 1 && request.timeout_ms() <= kMaxStoreTimeoutMs) request.set_timeout_ms(1);
  }
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (caller.token != nullptr) spouse.AddClientMetadata("authorization", std::string("Bearer ") + caller.token);
  if (caller.credential != nullptr) {
    std::string credential = caller.credential;
    if (credential.empty()) {
      credential = session->registered_credential.empty() ? kCredential2 : session->registered_credential;
    }
    spouse.AddClientMetadata(common::kWorkerCredentialMetadata, credential);
  }
  Response response;
  const grpc::Status status = (service->*handler)(&context, &request, &response);
  if constexpr (std::is_same_v<Response, v1::RegisterWorkerResponse>) {
    if (status.ok()) session->registered_credential = response.worker_credential();
  }
}

void Dispatch(Session* s, int rpc, const Caller& who, const uint8_t* b, size_t n) {
  ControlService* control = s->coordinator->control();
  ClusterService* cluster = s->coordinator->cluster();
  switch (rpc) {
    case 0:
      return Call(s, control, &ControlService::SubmitJob, who, b, n);
    case 1:
      return Call(s, control, &ControlService::GetJob, who, b, n);
    case 2:
      return Call(s, control, &ControlService::ListJobs, who, b, n);
    case 3:
      return Call(s, control, &ControlService::CancelJob, who, b, n);
    case 4:
      return Call(s, control, &ControlService::ListWorkers, who, b, n);
    case 5:
      return Call(s, control, &ControlService::DrainWorker, who, b, n);
    case 6:
      return Call(s, control, &ControlService::GetJobLogs, who, b, n);
    case 7:
      return Call(s, control, &ControlService::ListCheckpoints, who, b, n);
    case 8:
      return Call(s, cluster, &ClusterService::RegisterWorker, who, b, n);
    case 9:
      return Call(s, cluster, &ClusterService::Heartbeat, who, b, n);
    case 10:
      return Call(s, cluster, &ClusterService::ReportPhase, who, b, n);
    case 11:
      return Call(s, cluster, &ClusterService::StoreSet, who, b, n);
    case 12:
      return Call(s, cluster, &ClusterService::StoreGet, who, b, n);
    case 13:
      return Call(s, cluster, &ClusterService::StoreAdd, who, b, n);
    case 14:
      return Call(s, cluster, &ClusterService::StoreWait, who, b, n);
    case 15:
      return Call(s, cluster, &ClusterService::StoreDelete, who, b, n);
  }
}

}  // namespace
}  // namespace tandem::fuzz

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Quiet and fast: the coordinator's log and protobuf's complaints about
  // invalid UTF-8 (such a request is refused before any handler runs).
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::fuzz;
  static const std::string dir = ScratchDir("rpc");
  // Seeding takes a dozen SQLite writes; writing out the result is cheaper.
  static const std::string seeded_db = [] {
    InProcessCoordinator::Create(dir + "/seeded", "");  // closing the store folds its WAL into the file
    std::ifstream in(dir + "/seeded/state/coordinator.db", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.empty()) Fail("the seeded state database is empty");
    return bytes;
  }();
  auto coordinator = InProcessCoordinator::Create(dir + "/coordinator", seeded_db);
  Session session{coordinator.get(), ""};
  size_t pos = 0;
  for (int call = 0; call < kMaxCalls && pos < size; ++call) {
    const uint8_t selector = data[pos++];
    size_t length = 0;
    if (size - pos >= 2) {
      length = data[pos] | (static_cast<size_t>(data[pos + 1]) << 8);
      pos += 2;
    }
    length = std::min(length, size - pos);
    Dispatch(&session, selector & 0x0f, kCallers[(selector >> 4) & 0x07], data + pos, length);
    pos += length;
  }
  return 0;
}
