// A gRPC server interceptor that times every call the coordinator serves
// and counts it by method and status code into CoordinatorMetrics::Global()
// (tandem_grpc_server_handling_seconds, tandem_grpc_server_handled_total).
// Install with ServerBuilder::experimental().SetInterceptorCreators(
// MetricsInterceptorCreators()). One interceptor per call, owned by gRPC.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace tandem::server {

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> MetricsInterceptorCreators();

}  // namespace tandem::server
