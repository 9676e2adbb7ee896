// Link bandwidths as operators write them: "10Gbit", "800Mbit", "1.5GB/s",
// "200MB/s" (decimal units: 1 Gbit = 1e9 bits, 1 GB/s = 1e9 bytes per
// second), and a per-tier pair "intra=10Gbit,inter=1Gbit".
// Parsing is strict: a positive finite number, one of the four units, no
// other characters, at most kMaxBandwidthBytesPerS. Errors are
// InvalidArgument and quote the text. Pure functions; any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::common {

// 1 PB/s: far above any link; larger values are typing mistakes.
inline constexpr double kMaxBandwidthBytesPerS = 1e15;

// Bytes per second of one bandwidth text.
absl::StatusOr<double> ParseBandwidth(absl::string_view text);

struct TierBandwidth {
  double intra_bytes_per_s = 0;  // between ranks on one node
  double inter_bytes_per_s = 0;  // between nodes
};

// "intra=X,inter=Y" (both keys, once each, any order). "" is an error.
absl::StatusOr<TierBandwidth> ParseTierBandwidth(absl::string_view text);

// The largest unit that keeps the value >= 1: "10 Gbit/s", "800 Mbit/s",
// "12.5 kbit/s" (bits, as links are sold).
std::string FormatBandwidth(double bytes_per_s);

}  // namespace tandem::common
