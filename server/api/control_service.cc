#include "server/api/control_service.h"

#include "absl/strings/str_cat.h"
#include "common/status_util.h"
#include "server/api/request_checks.h"
#include "server/api/rpc_status.h"

namespace tandem::server {

using common::ToGrpcStatus;

grpc::Status ControlService::SubmitJob(grpc::ServerContext* ctx, const tandem::v1::SubmitJobRequest* req,
                                       tandem::v1::SubmitJobResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  if (!req->has_spec()) return ToGrpcStatus(absl::InvalidArgumentError("spec: required"));
  auto job = jobs_->Submit(req->spec());
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kInvalidArgument) {
      return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("spec.", job.status().message())));
    }
    return ToGrpcStatus(job.status());
  }
  resp->set_job_id(job->id());
  return grpc::Status::OK;
}

grpc::Status ControlService::GetJob(grpc::ServerContext* ctx, const tandem::v1::GetJobRequest* req,
                                    tandem::v1::Job* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  auto job = jobs_->Get(req->job_id());
  TANDEM_RPC_CHECK(job.status());
  *resp = *job;
  return grpc::Status::OK;
}

grpc::Status ControlService::ListJobs(grpc::ServerContext* ctx, const tandem::v1::ListJobsRequest* req,
                                      tandem::v1::ListJobsResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckRange("limit", req->limit(), 0, 10000));
  if (!tandem::v1::JobState_IsValid(req->state())) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("state: unknown value ", req->state())));
  }
  for (auto& job : jobs_->List(req->state(), req->limit() == 0 ? 1000 : req->limit())) {
    *resp->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::CancelJob(grpc::ServerContext* ctx, const tandem::v1::CancelJobRequest* req,
                                       tandem::v1::CancelJobResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  TANDEM_RPC_CHECK(CheckLine("reason", req->reason(), 1024));
  auto job = jobs_->Cancel(req->job_id(), req->reason());
  TANDEM_RPC_CHECK(job.status());
  *resp->mutable_job() = *job;
  return grpc::Status::OK;
}

grpc::Status ControlService::WatchJob(grpc::ServerContext* ctx, const tandem::v1::WatchJobRequest* req,
                                      grpc::ServerWriter<tandem::v1::JobEvent>* writer) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  auto job = jobs_->Get(req->job_id());
  TANDEM_RPC_CHECK(job.status());
  int64_t after = 0;
  if (!req->from_start()) {
    // Start with a snapshot of where the job is, then new events only.
    auto last = jobs_->LastEventSeq(req->job_id());
    TANDEM_RPC_CHECK(last.status());
    after = *last;
    tandem::v1::JobEvent snapshot;
    snapshot.set_job_id(job->id());
    snapshot.set_kind("state");
    snapshot.set_state(job->state());
    snapshot.set_message(absl::StrCat("job ", JobStateName(job->state()),
                                      job->reason().empty() ? "" : absl::StrCat(": ", job->reason())));
    if (job->has_latest()) *snapshot.mutable_metrics() = job->latest();
    snapshot.set_time(job->finished_at() > 0 ? job->finished_at() : job->created_at());
    if (!writer->Write(snapshot)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    if (IsTerminal(job->state())) return grpc::Status::OK;
  }
  while (!ctx->IsCancelled()) {
    if (stopping_->load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down");
    std::vector<StoredEvent> events;
    bool finished = false;
    TANDEM_RPC_CHECK(jobs_->NextEvents(req->job_id(), after, 500, &events, &finished));
    for (const auto& e : events) {
      if (!writer->Write(e.event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      after = e.seq;
    }
    if (finished) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled");
}

grpc::Status ControlService::ListWorkers(grpc::ServerContext* ctx, const tandem::v1::ListWorkersRequest* req,
                                         tandem::v1::ListWorkersResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  for (auto& w : membership_->List()) *resp->add_workers() = std::move(w);
  return grpc::Status::OK;
}

grpc::Status ControlService::DrainWorker(grpc::ServerContext* ctx, const tandem::v1::DrainWorkerRequest* req,
                                         tandem::v1::DrainWorkerResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("worker", req->worker()));
  auto w = membership_->Drain(req->worker());
  TANDEM_RPC_CHECK(w.status());
  *resp->mutable_worker() = *w;
  return grpc::Status::OK;
}

grpc::Status ControlService::GetJobLogs(grpc::ServerContext* ctx, const tandem::v1::GetJobLogsRequest* req,
                                        tandem::v1::GetJobLogsResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  TANDEM_RPC_CHECK(CheckRange("after_seq", req->after_seq(), 0, INT64_MAX));
  TANDEM_RPC_CHECK(CheckRange("limit", req->limit(), 0, 10000));
  auto lines = jobs_->Logs(req->job_id(), req->after_seq(), req->limit() == 0 ? 1000 : req->limit());
  TANDEM_RPC_CHECK(lines.status());
  int64_t next = req->after_seq();
  for (auto& l : *lines) {
    next = l.seq();
    *resp->add_lines() = std::move(l);
  }
  resp->set_next_seq(next);
  return grpc::Status::OK;
}

grpc::Status ControlService::ListCheckpoints(grpc::ServerContext* ctx, const tandem::v1::ListCheckpointsRequest* req,
                                             tandem::v1::ListCheckpointsResponse* resp) {
  TANDEM_RPC_CHECK(auth_->Require(*ctx, common::Role::kAdmin));
  TANDEM_RPC_CHECK(CheckId("job_id", req->job_id()));
  auto records = jobs_->Checkpoints(req->job_id());
  TANDEM_RPC_CHECK(records.status());
  for (auto& r : *records) *resp->add_checkpoints() = std::move(r);
  return grpc::Status::OK;
}

}  // namespace tandem::server
