#include "server/grpc_metrics.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>

#include "server/coordinator_metrics.h"

namespace tandem::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MetricsInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : ""),
        unary_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY),
        start_(std::chrono::steady_clock::now()) {}

  // A call that ends without sending a status (the client went away) counts as CANCELLED.
  ~MetricsInterceptor() override {
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) && !recorded_) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    recorded_ = true;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    CoordinatorMetrics::Global().RpcFinished(method_, static_cast<int>(code), unary_, seconds);
  }

  const std::string method_;
  const bool unary_;
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;
};

class MetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(info);
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> MetricsInterceptorCreators() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<MetricsInterceptorFactory>());
  return out;
}

}  // namespace tandem::server
