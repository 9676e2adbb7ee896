#include "worker/ckpt/async_writer.h"

namespace tandem::ckpt {

AsyncWriter::AsyncWriter() : thread_([this] { Loop(); }) {}

AsyncWriter::~AsyncWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncWriter::Submit(std::function<absl::Status()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_all();
}

absl::Status AsyncWriter::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return queue_.empty() && !running_; });
  absl::Status st = error_;
  error_ = absl::OkStatus();
  return st;
}

int64_t AsyncWriter::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

void AsyncWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    auto work = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    absl::Status st = work();
    lock.lock();
    running_ = false;
    ++completed_;
    if (!st.ok() && error_.ok()) error_ = st;
    cv_.notify_all();
  }
}

}  // namespace tandem::ckpt
