// Fuzz target: one checkpoint shard file (worker/ckpt/checkpoint.h), as a
// worker restoring a job reads it. The input is the whole file. The
// ShardFileInfo handed to ReadShard carries the file's real size and xxh64,
// as a manifest written with the file would, so every input gets past the
// checksum to the structural checks (magic, version, header, ranges,
// arrays). A shard that reads is then loaded as a one-rank checkpoint
// whose manifest says the ranges' extent. Any error Status is fine; a
// crash, a sanitizer report, a leak or an allocation beyond -rss_limit_mb
// is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "worker/ckpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::ckpt;
  static const std::string dir = tandem::fuzz::ScratchDir("ckpt_shard");
  ShardFileInfo info;
  info.file = ShardFileName(0, 1);
  info.rank = 0;
  info.bytes = size;
  info.xxh64 = Xxh64(data, size);
  tandem::fuzz::WriteFileOrDie(dir + "/" + info.file, data, size);
  auto shard = ReadShard(dir, info);
  if (!shard.ok()) return 0;

  Manifest m;
  m.world_size = 1;
  m.shards = {info};
  for (const Range& r : shard->ranges) m.total_floats = std::max(m.total_floats, r.offset + r.count);
  if (absl::Status st = WriteManifest(dir, m); !st.ok()) tandem::fuzz::Fail("WriteManifest: " + st.ToString());
  (void)LoadCheckpoint(dir);
  return 0;
}
