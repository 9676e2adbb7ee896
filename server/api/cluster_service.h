// Cluster service (workers): join token (or admin token) required.
// RegisterWorker/Heartbeat/Attach go to Membership; ReportPhase to the
// JobManager; Store* to the KvStore, only for a running job's current
// generation. Every call after RegisterWorker also presents the worker's
// credential (common::kWorkerCredentialMetadata): Heartbeat, Attach and
// ReportPhase only for the worker_id it was issued to, Store* only for the
// scopes of that worker's job. Attach streams the worker's command queue, with a ping every
// few seconds, until the worker re-attaches elsewhere, is lost, cancels, or
// the coordinator shuts down. Thread-safe (gRPC sync server threads).
#pragma once

#include <atomic>

#include "common/auth.h"
#include "server/jobs/job_manager.h"
#include "server/membership/membership.h"
#include "server/store/kv_store.h"
#include "tandem/v1/cluster.grpc.pb.h"
#include "tandem/v1/config.pb.h"

namespace tandem::server {

class PhaseTimeline;

class ClusterService final : public tandem::v1::Cluster::Service {
 public:
  ClusterService(const tandem::v1::CoordinatorConfig& config, JobManager* jobs, Membership* membership, KvStore* kv,
                 const common::TokenAuthenticator* auth, const std::atomic<bool>* stopping,
                 PhaseTimeline* timeline = nullptr)
      : config_(config),
        jobs_(jobs),
        membership_(membership),
        kv_(kv),
        auth_(auth),
        stopping_(stopping),
        timeline_(timeline) {}

  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const tandem::v1::RegisterWorkerRequest* req,
                              tandem::v1::RegisterWorkerResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const tandem::v1::HeartbeatRequest* req,
                         tandem::v1::HeartbeatResponse* resp) override;
  grpc::Status Attach(grpc::ServerContext* ctx, const tandem::v1::AttachRequest* req,
                      grpc::ServerWriter<tandem::v1::WorkerCommand>* writer) override;
  grpc::Status ReportPhase(grpc::ServerContext* ctx, const tandem::v1::ReportPhaseRequest* req,
                           tandem::v1::ReportPhaseResponse* resp) override;
  grpc::Status StoreSet(grpc::ServerContext* ctx, const tandem::v1::StoreSetRequest* req,
                        tandem::v1::StoreSetResponse* resp) override;
  grpc::Status StoreGet(grpc::ServerContext* ctx, const tandem::v1::StoreGetRequest* req,
                        tandem::v1::StoreGetResponse* resp) override;
  grpc::Status StoreAdd(grpc::ServerContext* ctx, const tandem::v1::StoreAddRequest* req,
                        tandem::v1::StoreAddResponse* resp) override;
  grpc::Status StoreWait(grpc::ServerContext* ctx, const tandem::v1::StoreWaitRequest* req,
                         tandem::v1::StoreWaitResponse* resp) override;
  grpc::Status StoreDelete(grpc::ServerContext* ctx, const tandem::v1::StoreDeleteRequest* req,
                           tandem::v1::StoreDeleteResponse* resp) override;

 private:
  absl::StatusOr<std::string> Scope(const tandem::v1::StoreScope& scope) const;
  // Scope() for a caller that must be a member of the scope's job and
  // generation (identified by its worker credential).
  absl::StatusOr<std::string> StoreScopeFor(const grpc::ServerContext& ctx, const tandem::v1::StoreScope& scope) const;
  // The call presents worker_id's own credential.
  absl::Status RequireWorker(const grpc::ServerContext& ctx, const std::string& worker_id) const;

  const tandem::v1::CoordinatorConfig config_;
  JobManager* jobs_;
  Membership* membership_;
  KvStore* kv_;
  const common::TokenAuthenticator* auth_;
  const std::atomic<bool>* stopping_;
  PhaseTimeline* timeline_;  // optional: phase commands and reports for the dashboard
};

}  // namespace tandem::server
