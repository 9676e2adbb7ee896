// Control service (tandemctl and operator tools): admin token required.
// Handlers validate every field, then hand over to JobManager/Membership;
// WatchJob streams events until the job ends, the client cancels or the
// coordinator shuts down. Thread-safe (gRPC sync server threads).
#pragma once

#include <atomic>

#include "common/auth.h"
#include "server/jobs/job_manager.h"
#include "server/membership/membership.h"
#include "tandem/v1/control.grpc.pb.h"

namespace tandem::server {

class ControlService final : public tandem::v1::Control::Service {
 public:
  ControlService(JobManager* jobs, Membership* membership, const common::TokenAuthenticator* auth,
                 const std::atomic<bool>* stopping)
      : jobs_(jobs), membership_(membership), auth_(auth), stopping_(stopping) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const tandem::v1::SubmitJobRequest* req,
                         tandem::v1::SubmitJobResponse* resp) override;
  grpc::Status GetJob(grpc::ServerContext* ctx, const tandem::v1::GetJobRequest* req, tandem::v1::Job* resp) override;
  grpc::Status ListJobs(grpc::ServerContext* ctx, const tandem::v1::ListJobsRequest* req,
                        tandem::v1::ListJobsResponse* resp) override;
  grpc::Status CancelJob(grpc::ServerContext* ctx, const tandem::v1::CancelJobRequest* req,
                         tandem::v1::CancelJobResponse* resp) override;
  grpc::Status WatchJob(grpc::ServerContext* ctx, const tandem::v1::WatchJobRequest* req,
                        grpc::ServerWriter<tandem::v1::JobEvent>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const tandem::v1::ListWorkersRequest* req,
                           tandem::v1::ListWorkersResponse* resp) override;
  grpc::Status DrainWorker(grpc::ServerContext* ctx, const tandem::v1::DrainWorkerRequest* req,
                           tandem::v1::DrainWorkerResponse* resp) override;
  grpc::Status GetJobLogs(grpc::ServerContext* ctx, const tandem::v1::GetJobLogsRequest* req,
                          tandem::v1::GetJobLogsResponse* resp) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* ctx, const tandem::v1::ListCheckpointsRequest* req,
                               tandem::v1::ListCheckpointsResponse* resp) override;

 private:
  JobManager* jobs_;
  Membership* membership_;
  const common::TokenAuthenticator* auth_;
  const std::atomic<bool>* stopping_;
};

}  // namespace tandem::server
