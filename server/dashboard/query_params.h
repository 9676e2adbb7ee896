// Query strings and form bodies (application/x-www-form-urlencoded) of
// dashboard requests, with errors that name the parameter: unknown names,
// repeated names, bad percent-encoding and out-of-range numbers are all
// INVALID_ARGUMENT. Pure functions; no state.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::server {

class QueryParams {
 public:
  // Splits "a=1&b=x%20y" (at most 32 parameters); every name must be in `allowed`.
  static absl::StatusOr<QueryParams> Parse(absl::string_view encoded, const std::set<std::string>& allowed);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The value ("" when absent).
  std::string Get(const std::string& name) const;
  // An integer in [min, max]; `fallback` when absent.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t min, int64_t max, int64_t fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// "%41+b" -> "A b"; INVALID_ARGUMENT on a bad escape.
absl::StatusOr<std::string> PercentDecode(absl::string_view in);

}  // namespace tandem::server
