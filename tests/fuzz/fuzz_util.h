// Helpers shared by the fuzz targets (tests/fuzz/*_fuzz.cc): a scratch
// directory per process for the targets whose parser reads files, a fast
// whole-file write, and Fail() for an invariant the target checks itself
// (a round trip that does not hold). A failure here is the harness's own
// or a broken invariant: it prints one line and aborts, which libFuzzer
// reports as a crash with the input saved. Header only; not thread-safe
// (libFuzzer calls a target from one thread).
#ifndef TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_
#define TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

namespace tandem::fuzz {

[[noreturn]] inline void Fail(std::string_view what) {
  std::fprintf(stderr, "fuzz target invariant broken: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

// $TMPDIR/tandem-fuzz-<name>-<pid> (TMPDIR defaults to /tmp), emptied and
// created on the first call (one name per process); removed when the
// process exits normally.
inline const std::string& ScratchDir(const char* name) {
  // Never destroyed: the exit handler below runs after static destructors.
  static const std::string* const dir = [name] {
    const char* tmp = std::getenv("TMPDIR");
    auto* d = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-fuzz-" + name +
                              "-" + std::to_string(::getpid()));
    std::error_code ec;
    std::filesystem::remove_all(*d, ec);
    std::filesystem::create_directories(*d, ec);
    if (ec) Fail("cannot create the scratch directory " + *d + ": " + ec.message());
    return d;
  }();
  static const bool cleanup_registered = [] {
    return std::atexit([] {
             std::error_code ignored;
             std::filesystem::remove_all(*dir, ignored);
           }) == 0;
  }();
  (void)cleanup_registered;
  return *dir;
}

// Replaces `path` with exactly `size` bytes of `data`. Retries system calls
// that a signal interrupted (libFuzzer's -timeout watchdog is SIGALRM).
inline void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) Fail("cannot write " + path + ": " + std::strerror(errno));
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Fail("cannot write " + path + ": " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

inline void WriteFileOrDie(const std::string& path, std::string_view text) {
  WriteFileOrDie(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace tandem::fuzz

#endif  // TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_
