// bench_tokenizer: MB/s of HfTokenizer::Encode on one thread over about
// 10 MB of documents (4 KB each) made deterministically from the
// checked-in corpus: its lines drawn at random and joined by newlines
// ("mixed"), or random lowercase words that almost never repeat, so nearly
// every word goes through the BPE merges instead of the word cache
// ("random-words"). --write-docs saves the documents for
// js_reference_bench.cjs, which times the JS reference on the same input.
//
//   build/bin/bench_tokenizer --tokenizer DIR [--corpus FILE] [--kind mixed|random-words]
//       [--mb 10] [--repeat 3] [--write-docs FILE]
//
// MB = 10^6 bytes of UTF-8 input; the best of --repeat passes is reported
// (the first pass fills the word cache, as a long-running worker's is), by
// wall time and by the process's CPU time (which other work on a shared
// machine does not inflate; run it pinned to one core: taskset -c 0).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/tokenizer/hf_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

// splitmix64: the same documents on every platform.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }
};

constexpr size_t kDocBytes = 4096;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<std::string> MixedDocs(const std::vector<std::string>& lines, size_t total) {
  Rng rng{12345};
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < total) {
    std::string doc;
    while (doc.size() < kDocBytes) {
      doc += lines[rng.Below(lines.size())];
      doc += '\n';
    }
    bytes += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::vector<std::string> RandomWordDocs(size_t total) {
  Rng rng{777};
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < total) {
    std::string doc;
    while (doc.size() < kDocBytes) {
      const size_t len = 3 + rng.Below(10);
      for (size_t i = 0; i < len; ++i) doc += static_cast<char>('a' + rng.Below(26));
      doc += rng.Below(12) == 0 ? ".\n" : " ";
    }
    bytes += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

int Usage(const char* msg) {
  std::fprintf(stderr,
               "bench_tokenizer: %s\nusage: bench_tokenizer --tokenizer DIR [--corpus FILE] "
               "[--kind mixed|random-words] [--mb 10] [--repeat 3] [--write-docs FILE]\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, corpus = "tests/tokenizer/corpus/corpus.json", kind = "mixed", write_docs;
  double mb = 10;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage(("missing value for " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--tokenizer") {
      dir = v;
    } else if (a == "--corpus") {
      corpus = v;
    } else if (a == "--kind") {
      kind = v;
    } else if (a == "--mb") {
      mb = std::atof(v.c_str());
    } else if (a == "--repeat") {
      repeat = std::atoi(v.c_str());
    } else if (a == "--write-docs") {
      write_docs = v;
    } else {
      return Usage(("unknown flag " + a).c_str());
    }
  }
  if (dir.empty()) return Usage("--tokenizer is required");
  if (!(mb > 0) || repeat < 1) return Usage("--mb and --repeat must be positive");
  if (kind != "mixed" && kind != "random-words") return Usage("--kind is mixed or random-words");

  const auto t0 = Clock::now();
  auto tok = tandem::tokenizer::HfTokenizer::LoadDir(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();

  const size_t total = static_cast<size_t>(mb * 1e6);
  std::vector<std::string> docs;
  if (kind == "mixed") {
    std::ifstream in(corpus, std::ios::binary);
    if (!in) return Usage(("cannot read " + corpus).c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    std::vector<std::string> lines = nlohmann::json::parse(ss.str()).get<std::vector<std::string>>();
    lines.erase(std::remove(lines.begin(), lines.end(), std::string()), lines.end());
    docs = MixedDocs(lines, total);
  } else {
    docs = RandomWordDocs(total);
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  if (!write_docs.empty()) {
    std::ofstream(write_docs, std::ios::binary) << nlohmann::json(docs).dump();
  }

  double best = 1e30, best_cpu = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    tokens = 0;
    const auto s = Clock::now();
    const double c = CpuSeconds();
    for (const auto& d : docs) tokens += tok->Encode(d).size();
    best_cpu = std::min(best_cpu, CpuSeconds() - c);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - s).count());
  }
  std::printf("tokenizer %s\ncorpus %s: %zu documents, %.2f MB, %zu tokens\n", dir.c_str(), kind.c_str(), docs.size(),
              static_cast<double>(bytes) / 1e6, tokens);
  std::printf("load %.2f s; encode best of %d: %.3f s = %.1f MB/s, %.2f M tokens/s (1 thread)\n", load_s, repeat, best,
              static_cast<double>(bytes) / 1e6 / best, static_cast<double>(tokens) / 1e6 / best);
  std::printf("by CPU time: %.3f s = %.1f MB/s\n", best_cpu, static_cast<double>(bytes) / 1e6 / best_cpu);
  return 0;
}
