// ParseBandwidth, ParseTierBandwidth, FormatBandwidth: see bandwidth.h.
#include "common/bandwidth.h"

#include <cmath>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tandem::common {
namespace {

constexpr std::pair<absl::string_view, double> kUnits[] = {
    {"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"GB/s", 1e9}, {"MB/s", 1e6}};

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bandwidth \"", text, "\": ", why,
                                                 " (expected a positive number and a unit: Gbit, Mbit, GB/s "
                                                 "or MB/s, as in 10Gbit or 200MB/s)"));
}

}  // namespace

absl::StatusOr<double> ParseBandwidth(absl::string_view text) {
  for (const auto& [unit, scale] : kUnits) {
    if (text.size() <= unit.size() || text.substr(text.size() - unit.size()) != unit) continue;
    const absl::string_view number = text.substr(0, text.size() - unit.size());
    double value = 0;
    if (number.empty() || number.front() == ' ' || number.back() == ' ' || !absl::SimpleAtod(number, &value) ||
        !std::isfinite(value)) {
      return Bad(text, absl::StrCat("\"", number, "\" is not a number"));
    }
    if (value <= 0) return Bad(text, "must be above zero");
    const double bytes = value * scale;
    if (bytes > kMaxBandwidthBytesPerS) {
      return Bad(text, absl::StrCat("above the limit of ", FormatBandwidth(kMaxBandwidthBytesPerS)));
    }
    return bytes;
  }
  return Bad(text, "no unit");
}

absl::StatusOr<TierBandwidth> ParseTierBandwidth(absl::string_view text) {
  const absl::string_view expect = " (expected intra=BANDWIDTH,inter=BANDWIDTH, as in intra=10Gbit,inter=1Gbit)";
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("tier bandwidth is empty", expect));
  TierBandwidth out;
  bool have_intra = false, have_inter = false;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier bandwidth \"", text, "\": \"", part, "\" has no '='", expect));
    }
    const absl::string_view key = part.substr(0, eq), value = part.substr(eq + 1);
    bool* have = key == "intra" ? &have_intra : key == "inter" ? &have_inter : nullptr;
    if (have == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier bandwidth \"", text, "\": unknown tier \"", key, "\"", expect));
    }
    if (*have) {
      return absl::InvalidArgumentError(absl::StrCat("tier bandwidth \"", text, "\": ", key, " given twice", expect));
    }
    *have = true;
    auto bytes = ParseBandwidth(value);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tier bandwidth ", key, ": ", bytes.status().message()));
    }
    (key == "intra" ? out.intra_bytes_per_s : out.inter_bytes_per_s) = *bytes;
  }
  if (!have_intra || !have_inter) {
    return absl::InvalidArgumentError(
        absl::StrCat("tier bandwidth \"", text, "\": missing ", have_intra ? "inter" : "intra", expect));
  }
  return out;
}

std::string FormatBandwidth(double bytes_per_s) {
  const double bits = bytes_per_s * 8;
  constexpr std::pair<double, const char*> kSteps[] = {
      {1e15, "Pbit/s"}, {1e12, "Tbit/s"}, {1e9, "Gbit/s"}, {1e6, "Mbit/s"}, {1e3, "kbit/s"}};
  for (const auto& [scale, unit] : kSteps) {
    if (bits >= scale) return absl::StrFormat("%.4g %s", bits / scale, unit);
  }
  return absl::StrFormat("%.4g bit/s", bits);
}

}  // namespace tandem::common
