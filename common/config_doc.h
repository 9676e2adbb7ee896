// The configuration reference in docs/ is generated from the tables
// (config_table.h). A Markdown file holds blocks
//   <!-- config-table job train -->
//   (generated table)
//   <!-- end config-table -->
// naming a table ("job", "coordinator", "worker") and a section: the first
// part of the keys' paths ("train"), "." for the top-level keys, "*" for
// every key. RenderConfigDoc rewrites the blocks; `tandem-config-doc`
// (config_doc_main.cc) applies it to files, and a test fails when a file
// and the tables differ. Pure functions.
#pragma once

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config_table.h"

namespace tandem::common {

// The tables by name (nullptr for an unknown name).
const ConfigTable* FindConfigTable(absl::string_view name);
std::vector<const ConfigTable*> AllConfigTables();

// The Markdown table of one section's keys.
std::string ConfigMarkdown(const ConfigTable& table, absl::string_view section);

// `doc` with every block regenerated. `covered` (optional) receives
// "table:path" of every key shown. Errors: an unknown table or an empty
// section, a block without its end.
absl::StatusOr<std::string> RenderConfigDoc(absl::string_view doc, std::set<std::string>* covered = nullptr);

}  // namespace tandem::common
