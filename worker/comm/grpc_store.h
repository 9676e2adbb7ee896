// GrpcStore: a Store backed by the coordinator's Cluster Store* RPCs
// (proto/tandem/v1/cluster.proto). Every key is scoped by (job id,
// generation) on the server. Each RPC carries "authorization: Bearer <token>"
// metadata and a deadline (blocking calls: their timeout plus rpc_slack).
// Channel: insecure, or TLS when ca_path names a PEM file of root certs.
//
// Thread-safe (the gRPC stub is). gRPC headers stay in grpc_store.cc.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/store.h"

namespace tandem::comm {

struct GrpcStoreOptions {
  std::string target;             // coordinator "host:port"
  std::string job_id;             // scope
  int64_t generation = 0;         // scope
  std::string token;              // bearer token ("" = no metadata)
  std::string worker_credential;  // the worker's credential ("" = none)
  std::string ca_path;            // "" = insecure channel
  std::string cert_path;          // client certificate for mutual TLS ("" = none)
  std::string key_path;           // its private key
  // Deadline of non-blocking calls, and extra time on top of blocking ones.
  std::chrono::milliseconds rpc_slack{10000};
};

// Creates the channel (does not connect yet). Fails when ca_path is
// unreadable.
absl::StatusOr<std::unique_ptr<Store>> MakeGrpcStore(const GrpcStoreOptions& options);

}  // namespace tandem::comm
