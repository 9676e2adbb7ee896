// Where tests find the real-world files tests/support/fetch-test-data.sh
// caches (Hugging Face tokenizer files, the reference tokenizer) and the
// programs they compare against. A missing file or program fails the test
// with what to run or install; it never skips it. Header-only (GoogleTest).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

namespace tandem::testing {

// $TANDEM_TEST_DATA_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/tandem-test-data
// (the script's default).
inline std::string TestDataDir() {
  if (const char* d = std::getenv("TANDEM_TEST_DATA_DIR"); d != nullptr && *d != '\0') return d;
  std::string cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = x;
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home != nullptr ? home : "") + "/.cache";
  }
  return cache + "/tandem-test-data";
}

// The path of `relpath` (a file or directory) under TestDataDir(). When it
// is missing, records a failure that names the fetch script and returns "":
//   const std::string dir = RequireTestDataFile("...");
//   ASSERT_FALSE(dir.empty());
inline std::string RequireTestDataFile(std::string_view relpath) {
  const std::string path = TestDataDir() + "/" + std::string(relpath);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    ADD_FAILURE() << "missing " << path << ": run tests/support/fetch-test-data.sh";
    return "";
  }
  return path;
}

// The path of an executable named `program` on PATH (or the path itself
// when it contains a '/'); when there is none, records a failure naming
// `install_hint` and returns "".
inline std::string RequireProgram(std::string_view program, std::string_view install_hint) {
  auto executable = [](const std::string& p) { return ::access(p.c_str(), X_OK) == 0; };
  if (program.find('/') != std::string_view::npos) {
    if (executable(std::string(program))) return std::string(program);
  } else if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string_view rest = path;
    while (!rest.empty()) {
      const size_t colon = rest.find(':');
      const std::string dir(rest.substr(0, colon));
      const std::string candidate = (dir.empty() ? "." : dir) + "/" + std::string(program);
      if (executable(candidate)) return candidate;
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  ADD_FAILURE() << program << " not found: " << install_hint;
  return "";
}

// Node.js, which runs the reference tokenizer.
inline std::string RequireNode() {
  return RequireProgram("node", "install nodejs (deploy/install-deps.sh --for-tests)");
}

}  // namespace tandem::testing
