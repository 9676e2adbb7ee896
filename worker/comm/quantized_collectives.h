// 4-bit blockwise gradient collectives with error feedback (LoCo).
//
// Format: each contiguous piece of floats is quantised on its own in blocks
// of kInt4Block values: one fp32 scale per block (max |x| / 7) and one
// signed 4-bit code per value (round to nearest, clamped to [-7, 7]), two
// codes per byte. A piece of n floats travels as Int4WireBytes(n) bytes:
// ceil(n / 2) + 4 * ceil(n / kInt4Block), about 1/7 of fp32.
//
// Error feedback: with an error buffer e, a rank sends Q(x + e) and keeps
// e = (x + e) - DQ(Q(x + e)); the part quantisation dropped travels with
// the next call. Without one (nullptr) the error is dropped.
//
// QuantizedExchange: a reduce-scatter as an all-to-all of quantised pieces
// (the owner dequantises and sums in fp32; its own piece is added exactly),
// and an allreduce as that reduce-scatter followed by an allgather of the
// owners' sums, quantised again with the owner's error buffer. Pieces move
// with send/recv (counted as kSendRecv) in N-1 rounds of disjoint pairs
// (round-robin schedule; the lower rank of a pair sends first), so every
// rank sends (N-1)/N of its input at 4 bits instead of fp32. Buffers are
// allocated once at construction (hot calls allocate nothing). HOST
// pointers only. One thread at a time, as Collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "worker/comm/collective.h"

namespace tandem::comm {

inline constexpr size_t kInt4Block = 64;

size_t Int4WireBytes(size_t n);
// wire[Int4WireBytes(n)] = Q(x + error); error (nullable) becomes the
// residual. x and error may not overlap wire.
void QuantizeInt4(const float* x, float* error, size_t n, uint8_t* wire);
// acc[i] += DQ(wire)[i].
void DequantizeAddInt4(const uint8_t* wire, size_t n, float* acc);
// out[i] = DQ(wire)[i].
void DequantizeInt4(const uint8_t* wire, size_t n, float* out);

// Pairs of round `round` (0 <= round < RoundRobinRounds(world)) of the
// round-robin schedule: partner of `rank`, or -1 when it sits out.
int RoundRobinPartner(int world, int round, int rank);
int RoundRobinRounds(int world);

class QuantizedExchange {
 public:
  // Sizes the buffers for calls of at most max_floats elements.
  QuantizedExchange(size_t max_floats, int world);

  // in[sum(counts)] (+ error[sum(counts)], nullable) -> out[counts[rank]]:
  // this rank's piece of the sum over ranks. `in` is not modified.
  absl::Status ReduceScatter(Collective& comm, const float* in, float* error, float* out,
                             const std::vector<size_t>& counts, Timeout timeout);
  // In place over data[n], split as SplitEven(n, size). error[n] feeds the
  // reduce-scatter; owner_error[SplitEven(n, size)[rank]] (nullable with
  // error) feeds the allgather of this rank's summed piece.
  absl::Status Allreduce(Collective& comm, float* data, size_t n, float* error, float* owner_error, Timeout timeout);

 private:
  std::vector<uint8_t> send_wire_;                 // every piece of the input, quantised
  std::vector<uint8_t> recv_wire_;                 // one piece
  std::vector<float> piece_;                       // this rank's summed piece
  std::vector<size_t> offs_, woff_, wire_floats_;  // per rank
};

}  // namespace tandem::comm
