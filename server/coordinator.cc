#include "server/coordinator.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/status_util.h"
#include "server/api/cluster_service.h"
#include "server/api/control_service.h"
#include "server/coordinator_metrics.h"
#include "server/dashboard/dashboard.h"
#include "server/dashboard/phase_timeline.h"
#include "server/grpc_metrics.h"
#include "server/jobs/job_manager.h"
#include "server/membership/membership.h"
#include "server/metrics_http.h"
#include "server/store/kv_store.h"
#include "server/store/state_store.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

std::string ConnectableHost(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") return "127.0.0.1";
  return host;
}

}  // namespace

Coordinator::Coordinator(tandem::v1::CoordinatorConfig config, std::unique_ptr<Clock> clock)
    : config_(std::move(config)), clock_(clock ? std::move(clock) : std::make_unique<SystemClock>()) {}

Coordinator::~Coordinator() { Shutdown(); }

std::string Coordinator::grpc_address() const {
  return absl::StrCat(ConnectableHost(config_.listen()), ":", grpc_port_);
}

std::string Coordinator::ReadyLine() const {
  return absl::StrCat("tandem-coordinator listening grpc=", grpc_address(), " metrics=",
                      config_.metrics_listen().empty()
                          ? std::string("off")
                          : absl::StrCat(ConnectableHost(config_.metrics_listen()), ":", metrics_port_));
}

absl::Status Coordinator::Start() {
  started_ = true;
  // Tokens: never logged.
  ASSIGN_OR_RETURN(std::string admin, common::LoadToken(config_.auth().admin_token_file(), common::kAdminTokenEnv));
  ASSIGN_OR_RETURN(std::string join, common::LoadToken(config_.auth().join_token_file(), common::kJoinTokenEnv));
  if (admin.empty() && !config_.auth().allow_unauthenticated()) {
    return absl::FailedPreconditionError(
        "no admin token: set auth.admin_token_file (--admin-token-file) or TANDEM_ADMIN_TOKEN "
        "(or auth.allow_unauthenticated: true for development)");
  }
  if (join.empty() && !admin.empty()) {
    spdlog::warn("no join token configured: workers authenticate with the admin token");
  }
  if (!join.empty() && common::ConstantTimeEquals(admin, join)) {
    spdlog::warn(
        "the admin token equals the join token: every worker can submit and cancel jobs; "
        "give workers their own join token");
  }
  for (const auto& file : {config_.auth().admin_token_file(), config_.auth().join_token_file()}) {
    for (const auto& warning : common::TokenFileWarnings(file)) spdlog::warn("{}", warning);
  }
  auth_ = std::make_unique<common::TokenAuthenticator>(admin, join, config_.auth().allow_unauthenticated());
  ASSIGN_OR_RETURN(auto creds, common::MakeServerCredentials(config_.tls().cert(), config_.tls().key(),
                                                             config_.tls().ca(), config_.tls().require_client_cert()));

  ASSIGN_OR_RETURN(store_, StateStore::Open(config_.state_dir()));
  std::error_code ec;
  std::filesystem::create_directories(config_.runs_dir(), ec);
  if (ec) spdlog::warn("runs dir {}: {}", config_.runs_dir(), ec.message());
  membership_ = std::make_unique<Membership>(config_, store_.get(), clock_.get());
  RETURN_IF_ERROR(membership_->Load());
  kv_ = std::make_unique<KvStore>();
  jobs_ = std::make_unique<JobManager>(config_, store_.get(), membership_.get(), kv_.get(), clock_.get());
  RETURN_IF_ERROR(jobs_->Load());

  timeline_ = std::make_unique<PhaseTimeline>(clock_.get());
  control_ = std::make_unique<ControlService>(jobs_.get(), membership_.get(), auth_.get(), &stopping_);
  cluster_ = std::make_unique<ClusterService>(config_, jobs_.get(), membership_.get(), kv_.get(), auth_.get(),
                                              &stopping_, timeline_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.listen(), creds, &grpc_port_);
  builder.RegisterService(control_.get());
  builder.RegisterService(cluster_.get());
  builder.experimental().SetInterceptorCreators(MetricsInterceptorCreators());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config_.max_message_bytes()));
  grpc::ResourceQuota quota("tandem-coordinator");
  quota.SetMaxThreads(config_.grpc_threads());
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.listen()));
  }
  auto* health = server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus("tandem.v1.Control", true);
  health->SetServingStatus("tandem.v1.Cluster", true);

  jobs_->Start();
  reaper_ = std::thread([this] { ReaperLoop(); });
  serving_ = true;

  if (!config_.metrics_listen().empty()) {
    metrics_ = std::make_unique<MetricsServer>();
    dashboard_ = std::make_unique<Dashboard>(jobs_.get(), membership_.get(), timeline_.get(), clock_.get(), admin,
                                             config_.insecure());
    RETURN_IF_ERROR(metrics_->Start(
        config_.metrics_listen(),
        [this] {
          return RenderMetrics(jobs_->Snapshot(), membership_->CountByState()) + CoordinatorMetrics::Global().Render();
        },
        [this] { return serving_.load() && !stopping_.load() && jobs_->loaded() && jobs_->StoreError().empty(); },
        HttpServerOptions{}, [this](HttpServer* http) { dashboard_->Register(http); }));
    metrics_port_ = metrics_->port();
  }
  return absl::OkStatus();
}

void Coordinator::ReaperLoop() {
  const int64_t every = std::max<int64_t>(20, std::min<int64_t>(config_.heartbeat_ms(), 250));
  while (!stop_reaper_.WaitForNotificationWithTimeout(absl::Milliseconds(every))) {
    for (const auto& lost : membership_->ExpireLeases()) {
      spdlog::warn("worker {} ({}) lost: {}{}", lost.worker_id, lost.name, lost.reason,
                   lost.job_id.empty() ? "" : absl::StrCat("; job ", lost.job_id, " rank ", lost.rank));
      jobs_->OnWorkerLost(lost);
    }
  }
}

void Coordinator::Shutdown() {
  if (!started_ || shut_down_) return;
  shut_down_ = true;
  spdlog::info("shutting down");
  stopping_ = true;
  serving_ = false;
  if (kv_) kv_->Shutdown();
  if (server_) {
    auto* health = server_->GetHealthCheckService();
    health->SetServingStatus(false);
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(config_.shutdown_grace_ms()));
  }
  if (jobs_) jobs_->Shutdown();
  if (reaper_.joinable()) {
    stop_reaper_.Notify();
    reaper_.join();
  }
  if (metrics_) metrics_->Stop();
  if (server_) server_->Wait();
  spdlog::info("stopped");
}

}  // namespace tandem::server
