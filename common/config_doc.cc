#include "common/config_doc.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/daemon_config.h"
#include "common/job_spec.h"

namespace tandem::common {
namespace {

constexpr absl::string_view kBegin = "<!-- config-table ";
constexpr absl::string_view kEnd = "<!-- end config-table -->";

bool InSection(absl::string_view path, absl::string_view section) {
  if (section == "*") return true;
  const size_t dot = path.find('.');
  if (section == ".") return dot == absl::string_view::npos;
  return dot != absl::string_view::npos && path.substr(0, dot) == section;
}

std::string Cell(absl::string_view text) { return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}}); }

}  // namespace

const ConfigTable* FindConfigTable(absl::string_view name) {
  for (const ConfigTable* t : AllConfigTables()) {
    if (t->name == name) return t;
  }
  return nullptr;
}

std::vector<const ConfigTable*> AllConfigTables() {
  return {&JobSpecTable(), &CoordinatorConfigTable(), &WorkerConfigTable()};
}

std::string ConfigMarkdown(const ConfigTable& table, absl::string_view section) {
  bool flags = false;
  for (const ConfigKey& key : table.keys()) flags |= !key.flag.empty() && InSection(key.path, section);
  std::string out = flags ? "| key | flag | type | default | allowed | meaning |\n|---|---|---|---|---|---|\n"
                          : "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const ConfigKey& key : table.keys()) {
    if (!InSection(key.path, section)) continue;
    std::string shown = DisplayPath(table.options, std::string(key.path));
    if (section != "*" && section != ".") shown = shown.substr(section.size() + 1);
    absl::StrAppend(&out, "| `", shown, "` | ");
    if (flags) absl::StrAppend(&out, key.flag.empty() ? "" : absl::StrCat("`--", key.flag, "`"), " | ");
    absl::StrAppend(&out, TypeText(table, key), " | ", Cell(DefaultText(table, key)), " | ",
                    Cell(AllowedText(table, key)), " | ", Cell(key.help), " |\n");
  }
  return out;
}

absl::StatusOr<std::string> RenderConfigDoc(absl::string_view doc, std::set<std::string>* covered) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t begin = doc.find(kBegin, pos);
    if (begin == absl::string_view::npos) break;
    const size_t line_end = doc.find("-->", begin);
    if (line_end == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("config-table block at byte ", begin, ": no -->"));
    }
    const absl::string_view spec =
        absl::StripAsciiWhitespace(doc.substr(begin + kBegin.size(), line_end - begin - kBegin.size()));
    const size_t space = spec.find(' ');
    const absl::string_view name = spec.substr(0, space);
    const absl::string_view section = space == absl::string_view::npos ? "*" : spec.substr(space + 1);
    const ConfigTable* table = FindConfigTable(name);
    if (table == nullptr) return absl::InvalidArgumentError(absl::StrCat("config-table ", spec, ": unknown table"));
    const size_t end = doc.find(kEnd, line_end);
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("config-table ", spec, ": no ", kEnd));
    }
    bool any = false;
    for (const ConfigKey& key : table->keys()) {
      if (!InSection(key.path, section)) continue;
      any = true;
      if (covered != nullptr) covered->insert(absl::StrCat(table->name, ":", key.path));
    }
    if (!any) return absl::InvalidArgumentError(absl::StrCat("config-table ", spec, ": no keys in that section"));
    absl::StrAppend(&out, doc.substr(pos, line_end + 3 - pos), "\n", ConfigMarkdown(*table, section), kEnd);
    pos = end + kEnd.size();
  }
  absl::StrAppend(&out, doc.substr(pos));
  return out;
}

}  // namespace tandem::common
