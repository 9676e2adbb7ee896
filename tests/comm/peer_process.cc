// comm_peer_process DIR RANK SIZE MODE: one rank of a multi-process test,
// rendezvous through a FileStore in DIR.
//   check: allreduce + all_scan + allgather vs references; exit 0 if right.
//   sleep: one allreduce, then sleep (the test kills this process).
//   stall: one allreduce, then creates DIR/receiving and waits in a recv of
//          kStallBytes from rank 0 (the test stops, then kills this process).
//   stall_allreduce: the same, in an allreduce of kStallBytes.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/collective.h"
#include "worker/comm/file_store.h"

int main(int argc, char** argv) {
  using namespace tandem::comm;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR RANK SIZE check|sleep|stall\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[2]), size = std::atoi(argv[3]);
  const std::string mode = argv[4];
  FileStore store(argv[1]);
  CollectiveOptions opts;
  opts.timeout = std::chrono::milliseconds(20000);
  auto c = MakeCollective("gloo", store, rank, size, opts);
  if (!c.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, c.status().ToString().c_str());
    return 1;
  }
  const Timeout t(20000);
  std::vector<float> data(100, static_cast<float>(rank + 1));
  if (!(*c)->allreduce(data.data(), 100, ReduceOp::kSum, t).ok()) return 1;
  if (mode == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "stall" || mode == "stall_allreduce") {
    constexpr size_t kStallBytes = size_t{64} << 20;  // as in failure_test.cc
    std::vector<char> sink(kStallBytes);
    std::ofstream(std::string(argv[1]) + "/receiving") << "1";
    if (mode == "stall") return (*c)->recv(sink.data(), sink.size(), 0, 7, t).ok() ? 0 : 1;
    std::vector<float> big(kStallBytes / sizeof(float), 1.f);
    return (*c)->allreduce(big.data(), big.size(), ReduceOp::kSum, t).ok() ? 0 : 1;
  }
  const float sum = size * (size + 1) / 2.f;
  for (float v : data)
    if (v != sum) return 3;
  std::vector<float> scan(70001, static_cast<float>(rank + 1));
  if (!(*c)->all_scan(scan.data(), scan.size(), ScanOp::Sum(), t).ok()) return 1;
  const float prefix = rank * (rank + 1) / 2.f;
  for (float v : scan)
    if (v != prefix) return 4;
  std::vector<size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = 1000 + r;
  size_t total = 0, off = 0;
  for (int r = 0; r < size; ++r) {
    if (r < rank) off += counts[r];
    total += counts[r];
  }
  std::vector<float> mine(counts[rank], static_cast<float>(rank)), all(total);
  if (!(*c)->allgather(mine.data(), all.data(), counts, t).ok()) return 1;
  size_t i = 0;
  for (int r = 0; r < size; ++r)
    for (size_t k = 0; k < counts[r]; ++k, ++i)
      if (all[i] != r) return 5;
  return (*c)->barrier(t).ok() ? 0 : 1;
}
