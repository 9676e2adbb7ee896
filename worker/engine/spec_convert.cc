#include "worker/engine/spec_convert.h"

namespace tandem::worker {

rl::TaskOptions ToTaskOptions(const tandem::v1::TaskSpec& task) {
  rl::TaskOptions o;
  o.name = task.name();
  o.op = task.op();
  o.digits = task.digits();
  o.min_len = task.min_len();
  o.max_len = task.max_len();
  o.format_reward = task.format_reward();
  o.partial_reward = task.partial_reward();
  return o;
}

uint64_t DeriveSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  // splitmix64 over the three words: a fixed, platform-independent mix.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ stream) ^ index);
}

}  // namespace tandem::worker
