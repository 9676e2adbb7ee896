#include "worker/comm/gloo_store.h"

#include <gloo/common/error.h>

namespace tandem::comm {
namespace {

[[noreturn]] void Throw(const absl::Status& s) {
  throw ::gloo::IoException(std::string("tandem store: ") + s.ToString());
}

}  // namespace

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(key, std::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> v = store_->Get(key, timeout_);
  if (!v.ok()) Throw(v.status());
  return std::vector<char>(v->begin(), v->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  absl::Status s = store_->Wait(keys, timeout);
  if (!s.ok()) Throw(s);
}

}  // namespace tandem::comm
