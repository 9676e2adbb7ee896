#include "worker/comm/collective.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/comm/backends_internal.h"

namespace tandem::comm {

std::string_view CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSendRecv:
      return "send_recv";
    case CollectiveKind::kAllScan:
      return "all_scan";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

ScanOp ScanOp::Sum() {
  ScanOp op;
  op.identity = 0.f;
  op.combine = [](const float* carry_in, const float* mine, float* carry_out, size_t /*offset*/, size_t count) {
    for (size_t i = 0; i < count; ++i) carry_out[i] = carry_in[i] + mine[i];
  };
  return op;
}

ScanOp ScanOp::Affine(float decay) {
  ScanOp op;
  op.identity = 0.f;
  op.combine = [decay](const float* carry_in, const float* mine, float* carry_out, size_t /*offset*/, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      carry_out[i] = decay * carry_in[i] + mine[i];
    }
  };
  return op;
}

ByteCount Collective::bytes(CollectiveKind kind) const {
  const auto& c = counts_[static_cast<int>(kind)];
  return ByteCount{c.sent.load(), c.received.load(), c.calls.load()};
}

ByteCount Collective::total_bytes() const {
  ByteCount total;
  for (const auto& c : counts_) {
    total.sent += c.sent.load();
    total.received += c.received.load();
    total.calls += c.calls.load();
  }
  return total;
}

void Collective::ResetBytes() {
  for (auto& c : counts_) {
    c.sent = 0;
    c.received = 0;
    c.calls = 0;
  }
}

void Collective::CountBytes(CollectiveKind kind, uint64_t sent, uint64_t received) {
  auto& c = counts_[static_cast<int>(kind)];
  c.sent += sent;
  c.received += received;
  c.calls += 1;
}

absl::Status Collective::alltoall(const float* /*in*/, const std::vector<size_t>& /*send_counts*/, float* /*out*/,
                                  const std::vector<size_t>& /*recv_counts*/, Timeout /*timeout*/) {
  return absl::UnimplementedError(
      absl::StrCat(std::string(backend()), ": all_to_all is not supported by this backend"));
}

std::vector<size_t> SplitEven(size_t n, int parts) {
  std::vector<size_t> counts(parts, n / parts);
  for (size_t i = 0; i < n % parts; ++i) counts[i] += 1;
  return counts;
}

std::vector<uint64_t> SpeedWeights(const std::vector<double>& speeds) {
  double top = 0;
  for (double s : speeds) top = std::max(top, s);
  std::vector<uint64_t> out;
  out.reserve(speeds.size());
  for (double s : speeds) {
    const double scaled = top > 0 ? (s / top) * 1048576.0 : 1.0;
    out.push_back(std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(scaled))));
  }
  return out;
}

std::vector<size_t> SplitWeighted(size_t n, const std::vector<uint64_t>& weights, size_t min_each) {
  const size_t parts = weights.size();
  if (parts == 0) return {};
  if (n < parts * min_each) min_each = 0;
  unsigned __int128 total_w = 0;
  for (uint64_t w : weights) total_w += w;
  const unsigned __int128 rest = n - parts * min_each;
  std::vector<size_t> counts(parts, min_each);
  std::vector<unsigned __int128> remainder(parts, 0);
  size_t given = 0;
  for (size_t i = 0; i < parts; ++i) {
    const unsigned __int128 q = rest * weights[i];
    counts[i] += static_cast<size_t>(q / total_w);
    given += static_cast<size_t>(q / total_w);
    remainder[i] = q % total_w;
  }
  std::vector<size_t> order(parts);
  for (size_t i = 0; i < parts; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t k = 0; given < static_cast<size_t>(rest); ++k, ++given) counts[order[k]] += 1;
  return counts;
}

absl::StatusOr<std::unique_ptr<Collective>> MakeCollective(std::string_view backend, Store& store, int rank, int size,
                                                           const CollectiveOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("collective: bad rank ", rank, " of size ", size));
  }
  if (backend == "gloo") return MakeGlooCollective(store, rank, size, options);
  if (backend == "nccl") {
#if defined(TANDEM_HAVE_NCCL)
    return MakeNcclCollective(store, rank, size, options);
#else
    return absl::UnimplementedError("nccl: backend not built (this build has no CUDA); use gloo");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("collective: unknown backend '", std::string(backend), "' (expected gloo or nccl)"));
}

}  // namespace tandem::comm
