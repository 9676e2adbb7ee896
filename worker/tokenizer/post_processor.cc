#include "worker/tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/tokenizer/bpe.h"

namespace tandem::tokenizer {

namespace {

// Checks one item of a template ({"SpecialToken": {...}} or {"Sequence":
// {...}}); sets *name (the special token) or *sequence ("A" / "B").
absl::Status ReadItem(const Json& item, const std::string& path, std::string* name, std::string* sequence) {
  if (!item.is_object() || item.size() != 1 || (!item.contains("SpecialToken") && !item.contains("Sequence"))) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}"));
  }
  const bool special = item.contains("SpecialToken");
  const std::string key = special ? "SpecialToken" : "Sequence";
  const std::string inner_path = JsonPath(path, key);
  const Json& inner = item[key];
  RETURN_IF_ERROR(CheckFields(inner, inner_path, {"id", "type_id"}));
  ASSIGN_OR_RETURN(const std::string id, ReadString(inner, inner_path, "id"));
  RETURN_IF_ERROR(ReadInt(inner, inner_path, "type_id", 0, 0, 1 << 20).status());
  if (special) {
    *name = id;
  } else {
    if (id != "A" && id != "B") {
      return absl::InvalidArgumentError(
          absl::StrCat(JsonPath(inner_path, "id"), ": expected \"A\" or \"B\", got \"", id, "\""));
    }
    *sequence = id;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PostProcessor> PostProcessor::FromJson(const Json& j, const std::string& path,
                                                      const std::function<bool(int32_t)>& known_id) {
  PostProcessor p;
  if (j.is_null()) return p;
  RETURN_IF_ERROR(Append(j, path, known_id, &p.templates_));
  return p;
}

PostProcessor PostProcessor::BosEos(std::optional<int32_t> bos, std::optional<int32_t> eos) {
  PostProcessor p;
  Template t;
  if (bos) t.before.push_back(*bos);
  if (eos) t.after.push_back(*eos);
  p.templates_.push_back(std::move(t));
  return p;
}

absl::Status PostProcessor::Append(const Json& j, const std::string& path, const std::function<bool(int32_t)>& known_id,
                                   std::vector<Template>* templates) {
  ASSIGN_OR_RETURN(const std::string type, ReadType(j, path));
  if (type == "Sequence") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "processors"}));
    const Json* list = FindField(j, "processors");
    const std::string list_path = JsonPath(path, "processors");
    if (list == nullptr || !list->is_array()) {
      return JsonTypeError(list_path, "an array", list ? *list : Json());
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Append((*list)[i], JsonPath(list_path, i), known_id, templates));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    for (const char* key : {"add_prefix_space", "trim_offsets", "use_regex"}) {
      RETURN_IF_ERROR(ReadBool(j, path, key, false).status());
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return UnsupportedType(path, type, "TemplateProcessing, ByteLevel, Sequence");
  }
  RETURN_IF_ERROR(CheckFields(j, path, {"type", "single", "pair", "special_tokens"}));

  // special_tokens: name -> ids.
  const std::string specials_path = JsonPath(path, "special_tokens");
  const Json* specials = FindField(j, "special_tokens");
  if (specials == nullptr || !specials->is_object()) {
    return JsonTypeError(specials_path, "an object", specials ? *specials : Json());
  }
  for (auto it = specials->begin(); it != specials->end(); ++it) {
    const std::string sp = JsonPath(specials_path, it.key());
    RETURN_IF_ERROR(CheckFields(it.value(), sp, {"id", "ids", "tokens"}));
    RETURN_IF_ERROR(ReadString(it.value(), sp, "id").status());
    const Json* ids = FindField(it.value(), "ids");
    const Json* tokens = FindField(it.value(), "tokens");
    if (ids == nullptr || !ids->is_array()) {
      return JsonTypeError(JsonPath(sp, "ids"), "an array", ids ? *ids : Json());
    }
    if (tokens == nullptr || !tokens->is_array()) {
      return JsonTypeError(JsonPath(sp, "tokens"), "an array", tokens ? *tokens : Json());
    }
    if (ids->size() != tokens->size()) {
      return absl::InvalidArgumentError(absl::StrCat(sp, ": ids and tokens differ in length"));
    }
    for (size_t i = 0; i < ids->size(); ++i) {
      const std::string ip = JsonPath(JsonPath(sp, "ids"), i);
      ASSIGN_OR_RETURN(const int64_t id, ReadIntValue((*ids)[i], ip, 0, kMaxTokenId));
      if (!known_id(static_cast<int32_t>(id))) {
        return absl::InvalidArgumentError(absl::StrCat(ip, ": no token has id ", id));
      }
      if (!(*tokens)[i].is_string()) {
        return JsonTypeError(JsonPath(JsonPath(sp, "tokens"), i), "a string", (*tokens)[i]);
      }
    }
  }

  // The templates: "single" is used; "pair" is checked only.
  Template single;
  for (const char* which : {"single", "pair"}) {
    const std::string tp = JsonPath(path, which);
    const Json* items = FindField(j, which);
    if (items == nullptr || !items->is_array()) {
      return JsonTypeError(tp, "an array", items ? *items : Json());
    }
    const bool is_single = std::string_view(which) == "single";
    int sequences = 0;
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string ip = JsonPath(tp, i);
      std::string name, sequence;
      RETURN_IF_ERROR(ReadItem((*items)[i], ip, &name, &sequence));
      if (!sequence.empty()) {
        if (is_single && sequence != "A") {
          return absl::InvalidArgumentError(absl::StrCat(ip, ": the single template can only hold sequence A"));
        }
        ++sequences;
        continue;
      }
      if (!specials->contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(ip, ": \"", name, "\" is not in ", specials_path));
      }
      if (!is_single) continue;
      std::vector<int32_t>& side = sequences == 0 ? single.before : single.after;
      for (const Json& id : (*specials)[name]["ids"]) side.push_back(id.get<int32_t>());
    }
    if (is_single && sequences != 1) {
      return absl::InvalidArgumentError(absl::StrCat(tp, ": must hold sequence A exactly once"));
    }
  }
  templates->push_back(std::move(single));
  return absl::OkStatus();
}

void PostProcessor::Apply(bool add_special_tokens, std::vector<int32_t>* ids) const {
  if (!add_special_tokens) return;
  for (const Template& t : templates_) {
    if (!t.before.empty()) ids->insert(ids->begin(), t.before.begin(), t.before.end());
    ids->insert(ids->end(), t.after.begin(), t.after.end());
  }
}

}  // namespace tandem::tokenizer
