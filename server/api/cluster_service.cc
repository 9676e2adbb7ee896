#include "server/api/cluster_service.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/rank_topology.h"
#include "common/status_util.h"
#include "server/api/request_checks.h"
#include "server/api/rpc_status.h"
#include "server/dashboard/phase_timeline.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

using common::ToGrpcStatus;

namespace {

constexpr int64_t kMaxStoreTimeoutMs = 30 * 60 * 1000;
constexpr int64_t kPingEveryMs = 5000;

absl::Status CheckMetrics(const std::string& field, const tandem::v1::StepMetrics& m) {
  if (m.phase_seconds_size() > 256 || m.extra_size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": at most 256 map entries"));
  }
  for (const auto& [k, v] : m.phase_seconds()) RETURN_IF_ERROR(CheckText(field + ".phase_seconds key", k, 128));
  for (const auto& [k, v] : m.extra()) RETURN_IF_ERROR(CheckText(field + ".extra key", k, 128));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ClusterService::Scope(const tandem::v1::StoreScope& scope) const {
  RETURN_IF_ERROR(CheckId("scope.job_id", scope.job_id()));
  RETURN_IF_ERROR(CheckRange("scope.generation", scope.generation(), 1, INT64_MAX));
  if (!jobs_->ScopeActive(scope.job_id(), scope.generation())) {
    return absl::FailedPreconditionError(
        absl::StrCat("scope: job ", scope.job_id(), " generation ", scope.generation(), " is not running"));
  }
  return KvStore::ScopeName(scope.job_id(), scope.generation());
}

absl::StatusOr<std::string> ClusterService::StoreScopeFor(const grpc::ServerContext& ctx,
                                                          const tandem::v1::StoreScope& scope) const {
  ASSIGN_OR_RETURN(std::string name, Scope(scope));
  // Only the job's own workers read or write its rendezvous store.
  ASSIGN_OR_RETURN(std::string worker_id, membership_->WorkerForCredential(common::PresentedWorkerCredential(ctx)));
  if (jobs_->JobGenerationFor(scope.job_id(), worker_id) != scope.generation()) {
    return absl::PermissionDeniedError(absl::StrCat("scope: worker ", worker_id, " is not in job ", scope.job_id(),
                                                    " generation ", scope.generation()));
  }
  return name;
}

absl::Status ClusterService::RequireWorker(const grpc::ServerContext& ctx, const std::string& worker_id) const {
  return membership_->CheckCredential(worker_id, common::PresentedWorkerCredential(ctx));
}

grpc::Status ClusterService::RegisterWorker(grpc::ServerContext* ctx, const tandem::v1::RegisterWorkerRequest* req,
                                            tandem::v1::RegisterWorkerResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  TANDEM_RPC_CHECK(CheckId("name", req->name()));
  TANDEM_RPC_CHECK(CheckLine("host", req->host(), 256));
  if (req->device() != tandem::v1::DEVICE_KIND_CPU && req->device() != tandem::v1::DEVICE_KIND_CUDA) {
    return ToGrpcStatus(absl::InvalidArgumentError("device: must be DEVICE_KIND_CPU or DEVICE_KIND_CUDA"));
  }
  TANDEM_RPC_CHECK(CheckRange("device_count", req->device_count(), 0, 1024));
  TANDEM_RPC_CHECK(CheckRange("memory_bytes", req->memory_bytes(), 0, INT64_MAX));
  TANDEM_RPC_CHECK(CheckLine("version", req->version(), 128));
  TANDEM_RPC_CHECK(CheckLine("data_address", req->data_address(), 256));
  if (!req->node().empty()) TANDEM_RPC_CHECK(common::CheckNodeName(req->node()));
  if (req->speed() != 0 && !(std::isfinite(req->speed()) && req->speed() > 0 && req->speed() <= 1e6)) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("speed: must be 0 (none) or a finite number in (0, 1e6], got ", req->speed())));
  }
  TANDEM_RPC_CHECK(CheckId("worker_id", req->worker_id(), false));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id(), false));
  TANDEM_RPC_CHECK(CheckRange("generation", req->generation(), 0, INT64_MAX));
  TANDEM_RPC_CHECK(CheckText("last_command_id", req->last_command_id(), 512));
  TANDEM_RPC_CHECK(CheckText("worker_credential", req->worker_credential(), common::kMaxTokenBytes));
  if (stopping_->load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
  int64_t generation = -1;
  if (!req->job_id().empty() && !req->worker_id().empty()) {
    generation = jobs_->JobGenerationFor(req->job_id(), req->worker_id());
  }
  auto result = membership_->Register(*req, generation);
  TANDEM_RPC_CHECK(result.status());
  if (!result->dropped_job.empty()) {
    jobs_->OnWorkerLost({result->worker_id, req->name(), result->dropped_job, -1,
                         "worker re-registered without the job's state (it restarted)"});
  }
  spdlog::info("worker {} ({}, {}) registered{}", result->worker_id, req->name(), req->host(),
               result->keep_job ? absl::StrCat(", keeps job ", req->job_id()) : "");
  resp->set_worker_id(result->worker_id);
  resp->set_worker_credential(result->credential);
  resp->set_lease_ms(config_.lease_ms());
  resp->set_heartbeat_interval_ms(config_.heartbeat_ms());
  resp->set_keep_job(result->keep_job);
  if (result->keep_job) resp->set_job_id(req->job_id());
  jobs_->NotifyScheduler();
  return grpc::Status::OK;
}

grpc::Status ClusterService::Heartbeat(grpc::ServerContext* ctx, const tandem::v1::HeartbeatRequest* req,
                                       tandem::v1::HeartbeatResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  TANDEM_RPC_CHECK(CheckId("worker_id", req->worker_id()));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id(), false));
  TANDEM_RPC_CHECK(CheckRange("memory_bytes_in_use", req->memory_bytes_in_use(), 0, INT64_MAX));
  absl::Status s = RequireWorker(*ctx, req->worker_id());
  if (absl::IsUnauthenticated(s)) return ToGrpcStatus(s);
  // Unknown, lost, or another worker took the name over after this one's
  // lease ran out: register again (which says who holds the name).
  if (s.ok()) s = membership_->Heartbeat(*req);
  resp->set_lease_ms(config_.lease_ms());
  if (absl::IsNotFound(s) || absl::IsPermissionDenied(s)) {
    resp->set_reregister(true);
    return grpc::Status::OK;
  }
  TANDEM_RPC_CHECK(s);
  if (timeline_) timeline_->MemoryReported(req->worker_id(), req->memory_bytes_in_use());
  if (req->preempting()) {
    // Graceful preemption: the job hands this worker over at its next step
    // boundary; once it is out of every job it may exit.
    const std::string job = membership_->MarkPreempting(req->worker_id());
    if (!job.empty()) jobs_->OnWorkerPreempting(req->worker_id(), job);
    resp->set_release(job.empty());
  }
  return grpc::Status::OK;
}

grpc::Status ClusterService::Attach(grpc::ServerContext* ctx, const tandem::v1::AttachRequest* req,
                                    grpc::ServerWriter<tandem::v1::WorkerCommand>* writer) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  TANDEM_RPC_CHECK(CheckId("worker_id", req->worker_id()));
  TANDEM_RPC_CHECK(RequireWorker(*ctx, req->worker_id()));
  auto attached = membership_->Attach(req->worker_id());
  TANDEM_RPC_CHECK(attached.status());
  auto [queue, epoch] = *attached;
  jobs_->OnWorkerAttached(req->worker_id());
  jobs_->NotifyScheduler();
  int64_t idle_ms = 0;
  grpc::Status result = grpc::Status::OK;
  while (true) {
    if (ctx->IsCancelled()) {
      result = grpc::Status(grpc::StatusCode::CANCELLED, "worker went away");
      break;
    }
    if (stopping_->load()) {
      result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
      break;
    }
    tandem::v1::WorkerCommand command;
    uint64_t clears = 0;
    const auto popped = membership_->IsCurrentAttach(req->worker_id(), epoch)
                            ? queue->Pop(epoch, 200, &command, &clears)
                            : CommandQueue::PopResult::kSuperseded;
    if (popped == CommandQueue::PopResult::kSuperseded) {
      // Commands stay queued for the newer stream.
      result = grpc::Status(grpc::StatusCode::ABORTED, "superseded by a newer registration or attach");
      break;
    }
    if (popped == CommandQueue::PopResult::kCommand) {
      idle_ms = 0;
      if (!writer->Write(command)) {
        // Not delivered: back to the front of the queue for the next stream.
        queue->Unpop(std::move(command), clears);
        result = grpc::Status(grpc::StatusCode::CANCELLED, "worker went away");
        break;
      }
      if (timeline_) timeline_->CommandSent(req->worker_id(), command);
      continue;
    }
    idle_ms += 200;
    if (idle_ms >= kPingEveryMs) {
      idle_ms = 0;
      tandem::v1::WorkerCommand ping;
      ping.set_ping(true);
      if (!writer->Write(ping)) {
        result = grpc::Status(grpc::StatusCode::CANCELLED, "worker went away");
        break;
      }
    }
  }
  membership_->Detach(req->worker_id(), epoch);
  return result;
}

grpc::Status ClusterService::ReportPhase(grpc::ServerContext* ctx, const tandem::v1::ReportPhaseRequest* req,
                                         tandem::v1::ReportPhaseResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  TANDEM_RPC_CHECK(CheckId("worker_id", req->worker_id()));
  TANDEM_RPC_CHECK(RequireWorker(*ctx, req->worker_id()));
  TANDEM_RPC_CHECK(CheckText("command_id", req->command_id(), 512));
  if (req->command_id().empty()) return ToGrpcStatus(absl::InvalidArgumentError("command_id: required"));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  TANDEM_RPC_CHECK(CheckRange("generation", req->generation(), 0, INT64_MAX));
  if (!tandem::v1::Phase_IsValid(req->phase())) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("phase: unknown value ", req->phase())));
  }
  TANDEM_RPC_CHECK(CheckText("error", req->error(), 64 * 1024));
  TANDEM_RPC_CHECK(CheckText("failure.message", req->failure().message(), 64 * 1024));
  if (!tandem::v1::PhaseFailureKind_IsValid(req->failure().kind())) {
    return ToGrpcStatus(
        absl::InvalidArgumentError(absl::StrCat("failure.kind: unknown value ", req->failure().kind())));
  }
  if (!tandem::v1::RestoreSource_IsValid(req->setup().restore_source())) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("setup.restore_source: unknown value ", req->setup().restore_source())));
  }
  TANDEM_RPC_CHECK(CheckMetrics("metrics", req->metrics()));
  if (req->values_size() > 256) return ToGrpcStatus(absl::InvalidArgumentError("values: at most 256 entries"));
  if (req->checkpoints_size() > 64) {
    return ToGrpcStatus(absl::InvalidArgumentError("checkpoints: at most 64 per report"));
  }
  for (int i = 0; i < req->checkpoints_size(); ++i) {
    const auto& c = req->checkpoints(i);
    const std::string field = absl::StrCat("checkpoints[", i, "]");
    if (c.path().empty()) return ToGrpcStatus(absl::InvalidArgumentError(field + ".path: required"));
    TANDEM_RPC_CHECK(CheckText(field + ".path", c.path(), 4096));
    TANDEM_RPC_CHECK(CheckRange(field + ".bytes", c.bytes(), 0, INT64_MAX));
  }
  if (req->log_lines_size() > 1000) {
    return ToGrpcStatus(absl::InvalidArgumentError("log_lines: at most 1000 lines per report"));
  }
  for (int i = 0; i < req->log_lines_size(); ++i) {
    TANDEM_RPC_CHECK(CheckText(absl::StrCat("log_lines[", i, "]"), req->log_lines(i), 4096));
  }
  TANDEM_RPC_CHECK(jobs_->OnReport(*req));
  if (timeline_) timeline_->ReportReceived(*req);
  return grpc::Status::OK;
}

grpc::Status ClusterService::StoreSet(grpc::ServerContext* ctx, const tandem::v1::StoreSetRequest* req,
                                      tandem::v1::StoreSetResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  auto scope = StoreScopeFor(*ctx, req->scope());
  TANDEM_RPC_CHECK(scope.status());
  TANDEM_RPC_CHECK(kv_->Set(*scope, req->key(), req->value()));
  return grpc::Status::OK;
}

grpc::Status ClusterService::StoreGet(grpc::ServerContext* ctx, const tandem::v1::StoreGetRequest* req,
                                      tandem::v1::StoreGetResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  auto scope = StoreScopeFor(*ctx, req->scope());
  TANDEM_RPC_CHECK(scope.status());
  TANDEM_RPC_CHECK(CheckRange("timeout_ms", req->timeout_ms(), 0, kMaxStoreTimeoutMs));
  auto value =
      kv_->Get(*scope, req->key(), req->timeout_ms(), [ctx, this] { return ctx->IsCancelled() || stopping_->load(); });
  TANDEM_RPC_CHECK(value.status());
  resp->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status ClusterService::StoreAdd(grpc::ServerContext* ctx, const tandem::v1::StoreAddRequest* req,
                                      tandem::v1::StoreAddResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  auto scope = StoreScopeFor(*ctx, req->scope());
  TANDEM_RPC_CHECK(scope.status());
  auto value = kv_->Add(*scope, req->key(), req->delta());
  TANDEM_RPC_CHECK(value.status());
  resp->set_value(*value);
  return grpc::Status::OK;
}

grpc::Status ClusterService::StoreWait(grpc::ServerContext* ctx, const tandem::v1::StoreWaitRequest* req,
                                       tandem::v1::StoreWaitResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  auto scope = StoreScopeFor(*ctx, req->scope());
  TANDEM_RPC_CHECK(scope.status());
  TANDEM_RPC_CHECK(CheckRange("timeout_ms", req->timeout_ms(), 0, kMaxStoreTimeoutMs));
  if (req->keys_size() == 0 || req->keys_size() > 1024) {
    return ToGrpcStatus(absl::InvalidArgumentError("keys: between 1 and 1024 keys"));
  }
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  TANDEM_RPC_CHECK(
      kv_->Wait(*scope, keys, req->timeout_ms(), [ctx, this] { return ctx->IsCancelled() || stopping_->load(); }));
  return grpc::Status::OK;
}

grpc::Status ClusterService::StoreDelete(grpc::ServerContext* ctx, const tandem::v1::StoreDeleteRequest* req,
                                         tandem::v1::StoreDeleteResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kWorker));
  auto scope = StoreScopeFor(*ctx, req->scope());
  TANDEM_RPC_CHECK(scope.status());
  auto deleted = kv_->Delete(*scope, req->key());
  TANDEM_RPC_CHECK(deleted.status());
  resp->set_deleted(*deleted);
  return grpc::Status::OK;
}

}  // namespace tandem::server
