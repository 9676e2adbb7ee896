// Fuzz target: a checkpoint's manifest.json (worker/ckpt/checkpoint.h), as
// a worker restoring a job reads it. The input is the manifest's text; it
// sits in a directory holding the fixed shard files of fixtures.h, so a
// manifest that names them (with their real sizes and checksums) gets past
// the checksums into the reassembly: ranges, coverage, total_floats.
// Version-1 manifests carry no checksum of their own, so edits of them
// reach every check. Any error Status is fine; a crash, a sanitizer report,
// a leak or an allocation beyond -rss_limit_mb is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fixtures.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/ckpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = tandem::fuzz::ScratchDir("ckpt_manifest");
    if (tandem::fuzz::WriteFixtureShards(d).empty()) tandem::fuzz::Fail("cannot write the fixture shards");
    return d;
  }();
  tandem::fuzz::WriteFileOrDie(dir + "/manifest.json", data, size);
  auto manifest = tandem::ckpt::ReadManifest(dir);
  if (manifest.ok()) (void)tandem::ckpt::CheckpointBytes(dir, *manifest);
  (void)tandem::ckpt::LoadCheckpoint(dir);
  return 0;
}
