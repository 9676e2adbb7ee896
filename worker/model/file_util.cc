#include "worker/model/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::model {

namespace {
absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Unpredictable and unique within the process: a counter and 64 random bits.
std::string TempSuffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrCat(counter.fetch_add(1), ".", absl::Hex(rng()));
}
}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Errno("cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Errno("cannot stat", path);
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view data) {
  return WriteFileAtomicParts(path, {data});
}

absl::Status WriteFileAtomicParts(const std::string& path, const std::vector<std::string_view>& parts) {
  return WriteFileAtomicStream(path, [&parts](const AtomicWriteFn& write) {
    for (std::string_view part : parts) {
      RETURN_IF_ERROR(write(part));
    }
    return absl::OkStatus();
  });
}

absl::Status WriteFileAtomicStream(const std::string& path,
                                   const std::function<absl::Status(const AtomicWriteFn& write)>& produce) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  // A fresh name opened with O_EXCL | O_NOFOLLOW: never an existing file,
  // and never through a symlink someone placed where the temp file goes.
  std::string tmp;
  Fd fd(-1);
  for (int attempt = 0; attempt < 16 && fd.get() < 0; ++attempt) {
    tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", TempSuffix());
    fd.reset(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0 && errno != EEXIST) return Errno("cannot create", tmp);
  }
  if (fd.get() < 0) return Errno("cannot create", tmp);
  {
    const int out = fd.get();
    absl::Status produced = produce([out, &tmp](std::string_view part) -> absl::Status {
      size_t done = 0;
      while (done < part.size()) {
        ssize_t n = ::write(out, part.data() + done, part.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Errno("cannot write", tmp);
        done += static_cast<size_t>(n);
      }
      return absl::OkStatus();
    });
    if (!produced.ok()) {
      ::unlink(tmp.c_str());
      return produced;
    }
    if (::fsync(fd.get()) != 0) {
      absl::Status st = Errno("cannot fsync", tmp);
      ::unlink(tmp.c_str());
      return st;
    }
    if (::close(fd.release()) != 0) {
      absl::Status st = Errno("cannot close", tmp);
      ::unlink(tmp.c_str());
      return st;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status st = Errno("cannot rename to", path);
    ::unlink(tmp.c_str());
    return st;
  }
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());
  return absl::OkStatus();
}

}  // namespace tandem::model
