// Command-line parsing for tandemctl: GNU-style long flags (--flag value or
// --flag=value), repeated flags (--set a=1 --set b=2), positionals, and "--"
// ending flag parsing. Each command declares the flags it accepts; anything
// else is a usage error with the flag's name. Global flags (--coordinator,
// --token-file, --tls-ca, --output, --help) are accepted by every command.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::cli {

struct FlagSpec {
  std::set<std::string> with_value;                // e.g. "set", "workers"
  std::set<std::string> booleans;                  // e.g. "follow", "local"
  std::map<std::string, std::string> short_names;  // "f" -> "follow"
};

struct ParsedArgs {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> values;
  std::set<std::string> set_booleans;

  bool Has(const std::string& name) const { return values.count(name) > 0 || set_booleans.count(name) > 0; }
  // Last value given for name, or fallback.
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
};

// Parses args (without the program and command words) against spec plus the
// global flags. Errors name the offending flag.
absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args, FlagSpec spec);

// Strict integer parse of a flag value, with a range.
absl::StatusOr<long long> ParseInt(const std::string& flag, const std::string& text, long long lo, long long hi);

}  // namespace tandem::cli
