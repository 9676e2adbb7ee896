// GlooStore: adapts a tandem::comm::Store to gloo::rendezvous::Store, which
// Gloo's rendezvous (Context::connectFullMesh) uses. Gloo's interface reports
// failures by throwing; this adapter throws gloo::IoException carrying the
// Store's status message, and callers (gloo_collective.cc) catch it at the
// boundary - nothing escapes the Collective API.
//
// Not owning: `store` must outlive the adapter. Thread-safe if `store` is.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "worker/comm/store.h"

namespace tandem::comm {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` applies to get() and wait() without an explicit timeout.
  GlooStore(comm::Store* store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  comm::Store* const store_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace tandem::comm
