// Helpers shared by the fuzz targets (tests/fuzz/*_fuzz.cc): a scratch
// directory per process for the targets whose parser reads files, a fast
// whole-file write, and Fail() for an invariant the target checks itself
// (a round trip that does not hold). A failure here is the harness's own
// or a broken invariant: it prints one line and aborts, which libFuzzer
// reports as a crash with the input saved. Header only; not thread-safe
// (libFuzzer calls a target from one thread).
#ifndef TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_
#define TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
    auto* d = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tandem-fuzz-" +
                              name + "-" + std::to_string(::getpid()));
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

// Replaces `path` with exactly `size` bytes of `data`.
inline void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) Fail("cannot write " + path);
  if (size > 0 && std::fwrite(data, 1, size, f) != size) Fail("short write to " + path);
  if (std::fclose(f) != 0) Fail("cannot close " + path);
}

inline void WriteFileOrDie(const std::string& path, std::string_view text) {
  WriteFileOrDie(path, reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

}  // namespace tandem::fuzz

#endif  // TANDEM_TESTS_FUZZ_FUZZ_UTIL_H_
