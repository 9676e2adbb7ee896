#include "server/cli/cli_args.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cli {

std::string ParsedArgs::Get(const std::string& name, const std::string& fallback) const {
  auto it = values.find(name);
  if (it == values.end() || it->second.empty()) return fallback;
  return it->second.back();
}

std::vector<std::string> ParsedArgs::GetAll(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<ParsedArgs> ParseArgs(const std::vector<std::string>& args, FlagSpec spec) {
  spec.with_value.insert({"coordinator", "token-file", "tls-ca", "tls-cert", "tls-key", "output"});
  spec.booleans.insert("help");
  spec.short_names.emplace("h", "help");
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      out.positional.insert(out.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      out.positional.push_back(a);
      continue;
    }
    std::string name, value;
    bool has_value = false;
    if (a.rfind("--", 0) == 0) {
      name = a.substr(2);
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
    } else {
      auto it = spec.short_names.find(a.substr(1));
      if (it == spec.short_names.end()) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
      name = it->second;
    }
    if (spec.booleans.count(name)) {
      if (has_value) {
        if (value == "true" || value == "1") {
          out.set_booleans.insert(name);
        } else if (value != "false" && value != "0") {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " takes true or false, got '", value, "'"));
        }
      } else {
        out.set_booleans.insert(name);
      }
      continue;
    }
    if (!spec.with_value.count(name)) {
      std::vector<std::string> known;
      for (const auto& f : spec.with_value) known.push_back("--" + f);
      for (const auto& f : spec.booleans) known.push_back("--" + f);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; allowed: ", absl::StrJoin(known, ", ")));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    out.values[name].push_back(value);
  }
  return out;
}

absl::StatusOr<long long> ParseInt(const std::string& flag, const std::string& text, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end == nullptr || *end != '\0') {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": expected an integer, got '", text, "'"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

}  // namespace tandem::cli
