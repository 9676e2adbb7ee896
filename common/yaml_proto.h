// YAML <-> protobuf messages with field paths in every error: the one reader
// behind job files (job_spec.h) and daemon configs (daemon_config.h).
//
// A YAML map is read into a message by field name (proto field names are the
// file's keys). Unknown keys, wrong types, out-of-range numbers, overlong
// strings and disallowed values are rejected with the key's path, e.g.
//   "train.stepz: unknown key; allowed: steps, lr, ..."
//   "train.steps: expected an integer, got 'abc'"
// Enums are written in lower case without their prefix (JOB_KIND_SFT: sft).
// yaml-cpp exceptions never leave this file. Thread-compatible (no state).
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace YAML {
class Node;
}

namespace tandem::common {

// One key of a configuration: a row of its table (config_table.h). The
// reader and CheckProtoRules use the constraints; config_table.h uses the
// default and the help for defaults, --help and the docs reference.
struct ConfigKey {
  absl::string_view path;         // proto field path, "train.micro_batch"
  absl::string_view def;          // default in YAML spelling ("1e-3", "fp32"); "" = the zero value
  absl::string_view def_from;     // default: the value of this other key ("rl.clip")
  absl::string_view doc_default;  // shown when the default is computed in code ("required", "<kind>-job")
  bool zero_is_value = false;     // over the API a zero is kept, not replaced by the default
  double min = -1e300;            // numbers and each element of repeated numbers
  double max = 1e300;
  bool min_exclusive = false;             // (min, max] instead of [min, max]
  std::vector<absl::string_view> one_of;  // strings: allowed values
  size_t max_len = 4096;                  // strings: characters; repeated: elements
  bool non_empty = false;                 // repeated: a list written empty ([]) is an error
  absl::string_view flag;                 // daemon configs: the command-line flag ("lease-ms")
  absl::string_view help;                 // one line for --help and the docs
};

struct YamlProtoOptions {
  // Rules by proto path; fields without one get the generic limits
  // (strings <= 4096 chars, repeated <= 4096 elements).
  std::vector<ConfigKey> rules;
  // Extra accepted YAML keys by proto path of the message -> alias -> field.
  // e.g. {"model.config.rope_scaling", {{"type", "rope_type"}}}.
  std::map<std::string, std::map<std::string, std::string>> aliases;
  // Keys accepted and ignored, by message path (e.g. HF config.json keys).
  std::map<std::string, std::set<std::string>> ignored;
  // Nested YAML maps whose keys map onto fields of the enclosing message:
  // {"init", {"sft", {{"steps", "sft_steps"}, {"lr", "sft_lr"}}}} reads
  // init.sft.steps into InitSpec.sft_steps.
  std::map<std::string, std::map<std::string, std::map<std::string, std::string>>> virtual_maps;
  // Maximal bytes of YAML text accepted.
  size_t max_text_bytes = 4 << 20;

  const ConfigKey* FindRule(absl::string_view proto_path) const;
};

// Parses YAML text ("what" names the source in errors). Malformed YAML ->
// INVALID_ARGUMENT "<what>: line L, column C: <reason>".
absl::StatusOr<YAML::Node> ParseYaml(absl::string_view text, absl::string_view what, size_t max_bytes = 4 << 20);
absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes);

// Applies "a.b.c=value" to the tree (creating maps on the way). The value is
// read as YAML ("8", "1e-4", "[1, 2]", "{a: 1}", "text").
absl::Status ApplyYamlOverride(YAML::Node& root, absl::string_view assignment);

// Reads `node` (a map, or null for "nothing set") into `msg`, overwriting the
// fields present; path is the message's YAML path ("" at the root).
absl::Status YamlToProto(const YAML::Node& node, google::protobuf::Message* msg, const YamlProtoOptions& options,
                         const std::string& path = "");

// Checks every field of `msg` (recursively, set sub-messages only) against
// the rules. `display` maps a proto path to the path shown in errors.
absl::Status CheckProtoRules(const google::protobuf::Message& msg, const YamlProtoOptions& options,
                             const std::string& path = "");

// Writes `msg` as YAML (every field, set sub-messages only; virtual maps
// and enum spellings as the reader expects them).
std::string ProtoToYaml(const google::protobuf::Message& msg, const YamlProtoOptions& options);

// The lower-case YAML spelling of an enum value (JOB_KIND_SFT -> "sft");
// "unknown" for nullptr (FindValueByNumber of an undeclared number).
std::string EnumYamlName(const google::protobuf::EnumValueDescriptor* value);

// Proto path -> the YAML path users write (virtual maps undone).
std::string DisplayPath(const YamlProtoOptions& options, const std::string& proto_path);

}  // namespace tandem::common
