// Tensor-parallel slices gathered from ZeRO shards (tp_gather.h).
#include "worker/rollout/tp_gather.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/model/param_layout.h"
#include "worker/rollout/tp_slice.h"

namespace tandem::rollout {
namespace {

constexpr uint32_t kTag = 0x7470;  // "tp"

// Moves of `count` floats: shard[src..) of the sender -> slice[dst..) of
// the receiver.
struct Move {
  size_t src = 0, dst = 0, count = 0;
};

// The receiver's slice runs that fall in the sender's shard pieces, in run
// order. Runs and pieces are both sorted by full offset.
std::vector<Move> Moves(const TpSliceMap& map, const std::vector<zero::ShardPiece>& pieces,
                        const std::vector<zero::Unit>& units) {
  std::vector<Move> out;
  size_t p = 0;
  for (const TpRun& run : map.runs) {
    size_t a = run.src;
    const size_t end = run.src + run.count;
    while (a < end && p < pieces.size()) {
      const size_t pb = units[pieces[p].unit].offset + pieces[p].unit_offset, pe = pb + pieces[p].size;
      if (pe <= a) {
        ++p;
        continue;
      }
      if (pb >= end) break;
      const size_t lo = std::max(a, pb), hi = std::min(end, pe);
      if (hi > lo) {
        Move m{pieces[p].shard_offset + (lo - pb), run.dst + (lo - run.src), hi - lo};
        if (!out.empty() && out.back().src + out.back().count == m.src && out.back().dst + out.back().count == m.dst) {
          out.back().count += m.count;
        } else {
          out.push_back(m);
        }
      }
      a = hi > a ? hi : end;
    }
  }
  return out;
}

size_t Floats(const std::vector<Move>& moves) {
  size_t n = 0;
  for (const Move& m : moves) n += m.count;
  return n;
}

}  // namespace

absl::StatusOr<TpGatherStats> GatherTpSlice(comm::Collective& world, const model::ModelConfig& config, int tp_size,
                                            const std::vector<zero::Unit>& units, const float* shard, float* slice,
                                            comm::Timeout timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const int N = world.size(), me = world.rank();
  if (tp_size < 1 || N % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollout.tp_size ", tp_size, " must divide the number of rollout workers (", N, ")"));
  }
  const model::ParamLayout layout(config);
  size_t expect = 0;
  for (const zero::Unit& u : units) {
    if (u.offset != expect) break;
    expect += u.size;
  }
  if (static_cast<int>(units.size()) != layout.num_units() || expect != layout.total_floats()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: the ZeRO unit table (", units.size(),
                                                   " units) does not match the model's layout (", layout.num_units(),
                                                   " units, ", layout.total_floats(), " floats)"));
  }
  std::vector<TpSliceMap> maps;
  for (int t = 0; t < tp_size; ++t) {
    ASSIGN_OR_RETURN(TpSliceMap m, MakeTpSliceMap(config, t, tp_size));
    maps.push_back(std::move(m));
  }
  const TpSliceMap& mine = maps[me % tp_size];
  std::fill(slice, slice + mine.slice_floats, 0.f);
  const std::vector<zero::ShardPiece> my_pieces = zero::ComputeShardMap(units, me, N);
  TpGatherStats stats;
  stats.slice_bytes = mine.slice_floats * sizeof(float);
  size_t my_shard = 0;
  for (const auto& p : my_pieces) my_shard += p.size;
  stats.full_gather_bytes = (layout.total_floats() - my_shard) * sizeof(float);

  // What I own of my own slice.
  for (const Move& m : Moves(mine, my_pieces, units)) {
    std::copy(shard + m.src, shard + m.src + m.count, slice + m.dst);
  }
  std::vector<float> buf;
  auto send_to = [&](int peer) -> absl::Status {
    const std::vector<Move> moves = Moves(maps[peer % tp_size], my_pieces, units);
    buf.resize(Floats(moves));
    size_t k = 0;
    for (const Move& m : moves) {
      std::copy(shard + m.src, shard + m.src + m.count, buf.data() + k);
      k += m.count;
    }
    if (buf.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(world.send(buf.data(), buf.size() * sizeof(float), peer, kTag, timeout));
    stats.bytes_sent += buf.size() * sizeof(float);
    return absl::OkStatus();
  };
  auto recv_from = [&](int peer) -> absl::Status {
    const std::vector<Move> moves = Moves(mine, zero::ComputeShardMap(units, peer, N), units);
    buf.resize(Floats(moves));
    if (buf.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(world.recv(buf.data(), buf.size() * sizeof(float), peer, kTag, timeout));
    size_t k = 0;
    for (const Move& m : moves) {
      std::copy(buf.data() + k, buf.data() + k + m.count, slice + m.dst);
      k += m.count;
    }
    stats.bytes_received += buf.size() * sizeof(float);
    return absl::OkStatus();
  };
  // Pairs (i, j), i < j, in one global order: i sends first, j receives
  // first.
  for (int i = 0; i < N; ++i) {
    for (int j = i + 1; j < N; ++j) {
      if (me == i) {
        RETURN_IF_ERROR(send_to(j));
        RETURN_IF_ERROR(recv_from(j));
      } else if (me == j) {
        RETURN_IF_ERROR(recv_from(i));
        RETURN_IF_ERROR(send_to(i));
      }
    }
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace tandem::rollout
