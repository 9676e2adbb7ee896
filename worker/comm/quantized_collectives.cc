// Int4 blockwise quantisation and QuantizedExchange: see
// quantized_collectives.h.
#include "worker/comm/quantized_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::comm {
namespace {

constexpr uint32_t kExchangeTag = 0x4c6f436f;  // "LoCo"

size_t Blocks(size_t n) { return (n + kInt4Block - 1) / kInt4Block; }

size_t WireBound(size_t max_floats, int world) {
  return Int4WireBytes(max_floats) + static_cast<size_t>(world) * (1 + sizeof(float)) + 16;
}

}  // namespace

size_t Int4WireBytes(size_t n) { return (n + 1) / 2 + sizeof(float) * Blocks(n); }

void QuantizeInt4(const float* x, float* error, size_t n, uint8_t* wire) {
  const size_t blocks = Blocks(n);
  uint8_t* codes = wire + sizeof(float) * blocks;
  std::memset(codes, 0, (n + 1) / 2);
  float v[kInt4Block];
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * kInt4Block, len = std::min(kInt4Block, n - begin);
    float amax = 0.f;
    for (size_t i = 0; i < len; ++i) {
      v[i] = x[begin + i] + (error != nullptr ? error[begin + i] : 0.f);
      amax = std::max(amax, std::fabs(v[i]));
    }
    const float scale = amax / 7.f;
    std::memcpy(wire + sizeof(float) * b, &scale, sizeof(float));
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    for (size_t i = 0; i < len; ++i) {
      const int q = static_cast<int>(std::clamp(std::nearbyint(v[i] * inv), -7.f, 7.f));
      const size_t at = begin + i;
      codes[at / 2] |= static_cast<uint8_t>((q & 0xf) << (4 * (at % 2)));
      if (error != nullptr) error[at] = v[i] - static_cast<float>(q) * scale;
    }
  }
}

namespace {
template <bool kAdd>
void Dequantize(const uint8_t* wire, size_t n, float* out) {
  const size_t blocks = Blocks(n);
  const uint8_t* codes = wire + sizeof(float) * blocks;
  for (size_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, wire + sizeof(float) * b, sizeof(float));
    const size_t begin = b * kInt4Block, end = std::min(n, begin + kInt4Block);
    for (size_t at = begin; at < end; ++at) {
      int q = (codes[at / 2] >> (4 * (at % 2))) & 0xf;
      if (q >= 8) q -= 16;
      const float value = static_cast<float>(q) * scale;
      if constexpr (kAdd) {
        out[at] += value;
      } else {
        out[at] = value;
      }
    }
  }
}
}  // namespace

void DequantizeAddInt4(const uint8_t* wire, size_t n, float* acc) { Dequantize<true>(wire, n, acc); }
void DequantizeInt4(const uint8_t* wire, size_t n, float* out) { Dequantize<false>(wire, n, out); }

int RoundRobinRounds(int world) { return world <= 1 ? 0 : (world % 2 == 0 ? world - 1 : world); }

int RoundRobinPartner(int world, int round, int rank) {
  const int m = world % 2 == 0 ? world : world + 1;  // with a dummy when odd
  int partner;
  if (rank == m - 1) {
    partner = round;
  } else if (rank == round) {
    partner = m - 1;
  } else {
    partner = ((2 * round - rank) % (m - 1) + (m - 1)) % (m - 1);
  }
  return partner >= world ? -1 : partner;
}

QuantizedExchange::QuantizedExchange(size_t max_floats, int world)
    : send_wire_(WireBound(max_floats, world)),
      recv_wire_(WireBound(max_floats, world)),
      piece_(max_floats / std::max(world, 1) + 1) {
  offs_.reserve(world);
  woff_.reserve(world);
  wire_floats_.reserve(world);
}

absl::Status QuantizedExchange::ReduceScatter(Collective& comm, const float* in, float* error, float* out,
                                              const std::vector<size_t>& counts, Timeout timeout) {
  const int world = comm.size(), r = comm.rank();
  if (counts.size() != static_cast<size_t>(world)) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized reduce_scatter: ", counts.size(), " counts for ", world, " ranks"));
  }
  std::vector<size_t>& offs = offs_;
  std::vector<size_t>& woff = woff_;
  offs.assign(world, 0);  // capacity reserved at construction
  woff.assign(world, 0);
  for (int j = 1; j < world; ++j) {
    offs[j] = offs[j - 1] + counts[j - 1];
    woff[j] = woff[j - 1] + Int4WireBytes(counts[j - 1]);
  }
  if (woff[world - 1] + Int4WireBytes(counts[world - 1]) > send_wire_.size() ||
      Int4WireBytes(counts[r]) > recv_wire_.size()) {
    return absl::InvalidArgumentError("quantized reduce_scatter: larger than the exchange was sized for");
  }
  for (int j = 0; j < world; ++j) {
    if (j != r)
      QuantizeInt4(in + offs[j], error != nullptr ? error + offs[j] : nullptr, counts[j], send_wire_.data() + woff[j]);
  }
  // The own piece does not travel: exact, and its residual is used up.
  for (size_t i = 0; i < counts[r]; ++i) {
    out[i] = in[offs[r] + i];
    if (error != nullptr) {
      out[i] += error[offs[r] + i];
      error[offs[r] + i] = 0.f;
    }
  }
  for (int round = 0; round < RoundRobinRounds(world); ++round) {
    const int p = RoundRobinPartner(world, round, r);
    if (p < 0) continue;
    const size_t send_bytes = counts[p] > 0 ? Int4WireBytes(counts[p]) : 0;
    const size_t recv_bytes = counts[r] > 0 ? Int4WireBytes(counts[r]) : 0;
    auto do_send = [&]() -> absl::Status {
      if (send_bytes == 0) return absl::OkStatus();
      return comm.send(send_wire_.data() + woff[p], send_bytes, p, kExchangeTag, timeout);
    };
    auto do_recv = [&]() -> absl::Status {
      if (recv_bytes == 0) return absl::OkStatus();
      RETURN_IF_ERROR(comm.recv(recv_wire_.data(), recv_bytes, p, kExchangeTag, timeout));
      DequantizeAddInt4(recv_wire_.data(), counts[r], out);
      return absl::OkStatus();
    };
    if (r < p) {
      RETURN_IF_ERROR(do_send());
      RETURN_IF_ERROR(do_recv());
    } else {
      RETURN_IF_ERROR(do_recv());
      RETURN_IF_ERROR(do_send());
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizedExchange::Allreduce(Collective& comm, float* data, size_t n, float* error, float* owner_error,
                                          Timeout timeout) {
  const int world = comm.size(), r = comm.rank();
  if (world == 1 || n == 0) return absl::OkStatus();
  const std::vector<size_t> counts = SplitEven(n, world);
  if (counts[r] > piece_.size()) {
    return absl::InvalidArgumentError("quantized allreduce: larger than the exchange was sized for");
  }
  RETURN_IF_ERROR(ReduceScatter(comm, data, error, piece_.data(), counts, timeout));
  // Allgather of the owners' quantised sums, each padded to whole floats.
  std::vector<size_t>& wire_floats = wire_floats_;
  wire_floats.assign(world, 0);
  size_t total = 0, mine_at = 0;
  for (int j = 0; j < world; ++j) {
    wire_floats[j] = (Int4WireBytes(counts[j]) + sizeof(float) - 1) / sizeof(float);
    if (j == r) mine_at = total;
    total += wire_floats[j];
  }
  if (total * sizeof(float) > send_wire_.size()) {
    return absl::InvalidArgumentError("quantized allreduce: larger than the exchange was sized for");
  }
  float* gathered = reinterpret_cast<float*>(send_wire_.data());
  QuantizeInt4(piece_.data(), owner_error, counts[r], reinterpret_cast<uint8_t*>(gathered + mine_at));
  RETURN_IF_ERROR(comm.allgather(gathered + mine_at, gathered, wire_floats, timeout));
  size_t at = 0, off = 0;
  for (int j = 0; j < world; ++j) {
    DequantizeInt4(reinterpret_cast<const uint8_t*>(gathered + at), counts[j], data + off);
    at += wire_floats[j];
    off += counts[j];
  }
  return absl::OkStatus();
}

}  // namespace tandem::comm
