#include "server/dashboard/query_params.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tandem::server {
namespace {

constexpr size_t kMaxParams = 32;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::StatusOr<std::string> PercentDecode(absl::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out += ' ';
    } else if (in[i] == '%') {
      const int hi = i + 2 < in.size() ? HexDigit(in[i + 1]) : -1;
      const int lo = i + 2 < in.size() ? HexDigit(in[i + 2]) : -1;
      if (i + 2 >= in.size() || hi < 0 || lo < 0) {
        return absl::InvalidArgumentError(absl::StrCat("bad percent-encoding at byte ", i));
      }
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

absl::StatusOr<QueryParams> QueryParams::Parse(absl::string_view encoded, const std::set<std::string>& allowed) {
  QueryParams params;
  if (encoded.empty()) return params;
  std::vector<absl::string_view> pairs = absl::StrSplit(encoded, '&');
  if (pairs.size() > kMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many query parameters (", pairs.size(), "; at most ", kMaxParams, ")"));
  }
  for (absl::string_view pair : pairs) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    auto name = PercentDecode(pair.substr(0, eq));
    if (!name.ok()) return absl::InvalidArgumentError(absl::StrCat("query parameter name: ", name.status().message()));
    if (!allowed.count(*name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown query parameter '", name->substr(0, 64),
                                                     "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
    auto value = PercentDecode(eq == absl::string_view::npos ? absl::string_view() : pair.substr(eq + 1));
    if (!value.ok()) return absl::InvalidArgumentError(absl::StrCat(*name, ": ", value.status().message()));
    if (!params.values_.emplace(*name, std::move(*value)).second) {
      return absl::InvalidArgumentError(absl::StrCat(*name, ": given more than once"));
    }
  }
  return params;
}

std::string QueryParams::Get(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? "" : it->second;
}

absl::StatusOr<int64_t> QueryParams::GetInt(const std::string& name, int64_t min, int64_t max, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": must be an integer in [", min, ", ", max, "], got '", it->second.substr(0, 64), "'"));
  }
  return v;
}

}  // namespace tandem::server
