// One table per configuration (the job spec, the coordinator config, the
// worker config): a row per key (ConfigKey in yaml_proto.h: proto path,
// default, range or allowed values, help, command-line flag). From the table
// come
// - the defaults of a message: DefaultMessage() for a file read on top of
//   them, ApplyDefaults() for a message that arrived over the API (zero
//   fields are "unset" in proto3);
// - the per-key checks of the YAML reader and CheckProtoRules (the table's
//   options are the reader's options);
// - --help lines and the docs/ reference (config_doc.h).
// A table whose paths, defaults or ranges disagree with each other or with
// the message is a programming error: MakeConfigTable checks it and aborts.
// Thread-safe once built (tables are immutable).
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "common/yaml_proto.h"

namespace tandem::common {

struct ConfigTable {
  std::string name;  // "job", "coordinator", "worker" (docs blocks name it)
  const google::protobuf::Descriptor* message = nullptr;
  // Reader options; options.rules are the table's rows, in document order.
  YamlProtoOptions options;
  // Sub-messages whose presence means something (model.config: inline or
  // from a directory): defaults under them apply only when they are set.
  std::set<std::string> optional_sections;
  // Built by FinishConfigTable: the literal defaults outside the optional
  // sections, and every literal default (the values ApplyDefaults copies).
  std::shared_ptr<const google::protobuf::Message> defaults;
  std::shared_ptr<const google::protobuf::Message> values;

  const std::vector<ConfigKey>& keys() const { return options.rules; }
};

// Checks the table against its message (every path names a scalar or
// repeated field, every default is legal by its own row) and builds
// `defaults`. Aborts with the offending row on a mistake.
void FinishConfigTable(ConfigTable& table);
absl::Status CheckConfigTable(const ConfigTable& table);

// `msg` (of the table's type) reset to the literal defaults (def_from and
// zero-valued keys left at zero: they are resolved by ApplyDefaults after a
// file is read).
void SetDefaults(const ConfigTable& table, google::protobuf::Message* msg);

// For messages that arrived over the API: every zero field whose key has a
// default (and is not zero_is_value) takes it; then every zero field with
// def_from takes the other key's value.
void ApplyDefaults(const ConfigTable& table, google::protobuf::Message* msg);

// The key's default as shown to users ("1e-3", "= rl.clip", "required", "").
std::string DefaultText(const ConfigTable& table, const ConfigKey& key);
// The allowed values/range as shown to users ("1..1000000000", "(0, 10]",
// "fp32, bf16"); "" when anything goes.
std::string AllowedText(const ConfigTable& table, const ConfigKey& key);
// The type as shown to users ("int", "float", "list of int", ...).
std::string TypeText(const ConfigTable& table, const ConfigKey& key);

// Reader options for one section read as a document of its own (a model
// config file is the job's model.config section): the section's rules,
// aliases and ignored keys with the section's path taken off.
YamlProtoOptions SectionOptions(const ConfigTable& table, absl::string_view section);

// The field a proto path names (nullptr if none).
const google::protobuf::FieldDescriptor* FindFieldByPath(const google::protobuf::Descriptor* message,
                                                         absl::string_view path);

}  // namespace tandem::common
