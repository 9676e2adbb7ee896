#include "worker/comm/grpc_store.h"

#include <fstream>
#include <sstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/base/status_macros.h"
#include "common/phase_failure.h"
#include "tandem/v1/cluster.grpc.pb.h"

namespace tandem::comm {
namespace {

absl::Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  // Whatever the code, a rendezvous store that fails is the cluster's
  // failure (a coordinator restart, a generation moved on): the job recovers.
  return common::WithFailureKind(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                              absl::StrCat("store rpc ", std::string(what), ": ", s.error_message())),
                                 tandem::v1::PHASE_FAILURE_KIND_RETRYABLE);
}

class GrpcStore final : public Store {
 public:
  GrpcStore(const GrpcStoreOptions& options, std::shared_ptr<grpc::Channel> channel)
      : options_(options), stub_(tandem::v1::Cluster::NewStub(channel)) {
    scope_.set_job_id(options.job_id);
    scope_.set_generation(options.generation);
  }

  absl::Status Set(std::string_view key, std::string_view value) override {
    tandem::v1::StoreSetRequest req;
    *req.mutable_scope() = scope_;
    req.set_key(std::string(key));
    req.set_value(std::string(value));
    tandem::v1::StoreSetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::milliseconds(0));
    return FromGrpc(stub_->StoreSet(&ctx, req, &resp), "StoreSet");
  }

  absl::StatusOr<std::string> Get(std::string_view key, std::chrono::milliseconds timeout) override {
    tandem::v1::StoreGetRequest req;
    *req.mutable_scope() = scope_;
    req.set_key(std::string(key));
    req.set_timeout_ms(timeout.count());
    tandem::v1::StoreGetResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout);
    RETURN_IF_ERROR(FromGrpc(stub_->StoreGet(&ctx, req, &resp), "StoreGet"));
    return std::move(*resp.mutable_value());
  }

  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    tandem::v1::StoreAddRequest req;
    *req.mutable_scope() = scope_;
    req.set_key(std::string(key));
    req.set_delta(delta);
    tandem::v1::StoreAddResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::milliseconds(0));
    RETURN_IF_ERROR(FromGrpc(stub_->StoreAdd(&ctx, req, &resp), "StoreAdd"));
    return resp.value();
  }

  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    tandem::v1::StoreWaitRequest req;
    *req.mutable_scope() = scope_;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(timeout.count());
    tandem::v1::StoreWaitResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, timeout);
    return FromGrpc(stub_->StoreWait(&ctx, req, &resp), "StoreWait");
  }

  absl::StatusOr<bool> Delete(std::string_view key) override {
    tandem::v1::StoreDeleteRequest req;
    *req.mutable_scope() = scope_;
    req.set_key(std::string(key));
    tandem::v1::StoreDeleteResponse resp;
    grpc::ClientContext ctx;
    Prepare(&ctx, std::chrono::milliseconds(0));
    RETURN_IF_ERROR(FromGrpc(stub_->StoreDelete(&ctx, req, &resp), "StoreDelete"));
    return resp.deleted();
  }

 private:
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds blocking) {
    ctx->set_deadline(std::chrono::system_clock::now() + blocking + options_.rpc_slack);
    if (!options_.token.empty()) {
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
    }
    if (!options_.worker_credential.empty()) {
      ctx->AddMetadata(common::kWorkerCredentialMetadata, options_.worker_credential);
    }
  }

  const GrpcStoreOptions options_;
  tandem::v1::StoreScope scope_;
  std::unique_ptr<tandem::v1::Cluster::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> MakeGrpcStore(const GrpcStoreOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.ca_path.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    std::ifstream in(options.ca_path);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("store: cannot read CA file '", options.ca_path, "'"));
    }
    std::stringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    // Mutual TLS: the worker's client certificate and key, when given.
    for (auto [path, field] :
         {std::pair{&options.cert_path, &ssl.pem_cert_chain}, std::pair{&options.key_path, &ssl.pem_private_key}}) {
      if (path->empty()) continue;
      std::ifstream f(*path);
      if (!f) {
        return absl::NotFoundError(absl::StrCat("store: cannot read TLS file '", *path, "'"));
      }
      std::stringstream buf;
      buf << f.rdbuf();
      *field = buf.str();
    }
    creds = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(options.target, creds);
  return std::unique_ptr<Store>(new GrpcStore(options, std::move(channel)));
}

}  // namespace tandem::comm
