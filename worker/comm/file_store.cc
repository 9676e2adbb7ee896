#include "worker/comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::comm {
namespace {

std::atomic<uint64_t> g_tmp_counter{0};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

absl::Status WriteAtomically(const std::string& path, std::string_view value) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", g_tmp_counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::UnavailableError(absl::StrCat("file store: cannot write ", tmp));
    }
    out.write(value.data(), value.size());
    if (!out) {
      return absl::UnavailableError(absl::StrCat("file store: short write to ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("file store: cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// Polls `ready` with a growing sleep until it returns true or time runs out.
template <typename F>
bool PollUntil(F ready, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::microseconds(1000);
  for (;;) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(10000));
  }
}

}  // namespace

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
}

std::string FileStore::Path(std::string_view key) const {
  return absl::StrCat(dir_, "/k", absl::BytesToHexString(std::string(key)));
}

absl::Status FileStore::Set(std::string_view key, std::string_view value) { return WriteAtomically(Path(key), value); }

absl::StatusOr<std::string> FileStore::Get(std::string_view key, std::chrono::milliseconds timeout) {
  const std::string path = Path(key);
  std::string value;
  if (!PollUntil([&] { return ReadFile(path, &value); }, timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("file store: key '", std::string(key), "' not set within ", timeout.count(), " ms"));
  }
  return value;
}

absl::StatusOr<int64_t> FileStore::Add(std::string_view key, int64_t delta) {
  const std::string lock_path = dir_ + "/.lock";
  int fd = open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("file store: cannot open ", lock_path));
  }
  flock(fd, LOCK_EX);
  std::string old;
  int64_t value = 0;
  absl::Status status;
  if (ReadFile(Path(key), &old) && !absl::SimpleAtoi(old, &value)) {
    status = absl::FailedPreconditionError(
        absl::StrCat("file store: key '", std::string(key), "' does not hold an integer"));
  } else {
    value += delta;
    status = WriteAtomically(Path(key), absl::StrCat(value));
  }
  flock(fd, LOCK_UN);
  close(fd);
  RETURN_IF_ERROR(status);
  return value;
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  auto all = [&] {
    for (const auto& k : keys) {
      struct stat st;
      if (stat(Path(k).c_str(), &st) != 0) return false;
    }
    return true;
  };
  if (!PollUntil(all, timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("file store: keys not all set within ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FileStore::Delete(std::string_view key) { return std::remove(Path(key).c_str()) == 0; }

}  // namespace tandem::comm
