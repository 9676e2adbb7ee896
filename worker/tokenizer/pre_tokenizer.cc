#include "worker/tokenizer/pre_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/tokenizer/byte_level.h"

namespace tandem::tokenizer {

namespace {

// The pattern of the ByteLevel pre-tokenizer's use_regex (GPT-2).
constexpr char kGpt2Pattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

absl::StatusOr<PreTokenizer> PreTokenizer::FromJson(const Json& j, const std::string& path) {
  PreTokenizer p;
  if (j.is_null()) return p;
  RETURN_IF_ERROR(Append(j, path, &p.stages_));
  return p;
}

absl::Status PreTokenizer::Append(const Json& j, const std::string& path, std::vector<Stage>* stages) {
  ASSIGN_OR_RETURN(const std::string type, ReadType(j, path));
  if (type == "Sequence") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "pretokenizers"}));
    const Json* list = FindField(j, "pretokenizers");
    const std::string list_path = JsonPath(path, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return JsonTypeError(list_path, "an array", list ? *list : Json());
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Append((*list)[i], JsonPath(list_path, i), stages));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "pattern", "behavior", "invert"}));
    Stage s{Kind::kSplit};
    const Json* pattern = FindField(j, "pattern");
    if (pattern == nullptr) return absl::InvalidArgumentError(JsonPath(path, "pattern") + " is missing");
    ASSIGN_OR_RETURN(Pattern pat, Pattern::FromJson(*pattern, JsonPath(path, "pattern")));
    s.pattern = std::make_shared<const Pattern>(std::move(pat));
    ASSIGN_OR_RETURN(const std::string behavior, ReadString(j, path, "behavior"));
    if (behavior == "Removed") {
      s.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      s.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      s.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      s.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      s.behavior = Behavior::kContiguous;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(JsonPath(path, "behavior"), " \"", behavior,
                       "\" is not supported (supported: Removed, Isolated, MergedWithPrevious, "
                       "MergedWithNext, Contiguous)"));
    }
    ASSIGN_OR_RETURN(s.invert, ReadBool(j, path, "invert", false));
    stages->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    Stage s{Kind::kByteLevel};
    ASSIGN_OR_RETURN(s.add_prefix_space, ReadBool(j, path, "add_prefix_space", true));
    // trim_offsets only moves offsets, which are not produced here.
    ASSIGN_OR_RETURN(bool trim_offsets, ReadBool(j, path, "trim_offsets", true));
    (void)trim_offsets;
    ASSIGN_OR_RETURN(const bool use_regex, ReadBool(j, path, "use_regex", true));
    if (use_regex) {
      ASSIGN_OR_RETURN(Pattern pat, Pattern::FromRegex(kGpt2Pattern));
      s.pattern = std::make_shared<const Pattern>(std::move(pat));
    }
    stages->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    RETURN_IF_ERROR(
        CheckFields(j, path, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
    Stage s{Kind::kMetaspace};
    ASSIGN_OR_RETURN(s.replacement, ReadChar(j, path, "replacement", "\u2581"));
    if (const Json* rep = FindField(j, "str_rep"); rep != nullptr) {
      ASSIGN_OR_RETURN(const std::string str_rep, ReadChar(j, path, "str_rep", ""));
      if (str_rep != s.replacement) {
        return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "str_rep"), " differs from replacement"));
      }
    }
    ASSIGN_OR_RETURN(const std::optional<std::string> scheme, ReadOptionalString(j, path, "prepend_scheme"));
    const Json* aps = FindField(j, "add_prefix_space");
    if (aps != nullptr && !aps->is_boolean()) {
      return JsonTypeError(JsonPath(path, "add_prefix_space"), "a boolean", *aps);
    }
    const bool add_prefix_space = aps == nullptr || aps->get<bool>();
    if (!scheme.has_value()) {
      s.prepend = add_prefix_space ? Prepend::kAlways : Prepend::kNever;
    } else if (*scheme == "always") {
      s.prepend = Prepend::kAlways;
    } else if (*scheme == "first") {
      s.prepend = Prepend::kFirst;
    } else if (*scheme == "never") {
      s.prepend = Prepend::kNever;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "prepend_scheme"), " \"", *scheme,
                                                     "\" is not supported (supported: always, first, never)"));
    }
    if (!add_prefix_space && s.prepend != Prepend::kNever) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": add_prefix_space false contradicts prepend_scheme \"", *scheme, "\""));
    }
    ASSIGN_OR_RETURN(s.split, ReadBool(j, path, "split", true));
    ASSIGN_OR_RETURN(Pattern pat, Pattern::Literal(s.replacement));
    s.pattern = std::make_shared<const Pattern>(std::move(pat));
    stages->push_back(std::move(s));
    return absl::OkStatus();
  }
  return UnsupportedType(path, type, "Split, ByteLevel, Metaspace, Sequence");
}

void PreTokenizer::ApplyBehavior(Behavior behavior, bool invert, std::vector<Segment>* segs) {
  std::vector<Segment>& v = *segs;
  if (invert) {
    for (Segment& s : v) s.is_match = !s.is_match;
  }
  // After this, is_match means "drop this piece".
  switch (behavior) {
    case Behavior::kRemoved:
      return;
    case Behavior::kIsolated:
      for (Segment& s : v) s.is_match = false;
      return;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      const bool contiguous = behavior == Behavior::kContiguous;
      size_t w = 0;
      bool previous_match = false;
      for (size_t r = 0; r < v.size(); ++r) {
        const Segment s = v[r];
        const bool merge = contiguous ? s.is_match == previous_match : s.is_match && !previous_match;
        if (merge && w > 0) {
          v[w - 1].end = s.end;
        } else {
          v[w++] = {s.start, s.end, false};
        }
        previous_match = s.is_match;
      }
      v.resize(w);
      return;
    }
    case Behavior::kMergedWithNext: {
      size_t w = v.size();
      bool previous_match = false;
      for (size_t r = v.size(); r-- > 0;) {
        const Segment s = v[r];
        if (s.is_match && !previous_match && w < v.size()) {
          v[w].start = s.start;
        } else {
          v[--w] = {s.start, s.end, false};
        }
        previous_match = s.is_match;
      }
      v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(w));
      return;
    }
  }
}

void PreTokenizer::Run(std::string_view text, bool at_start, Scratch* scratch,
                       absl::FunctionRef<void(std::string_view)> emit) const {
  if (text.empty()) return;
  if (stages_.empty()) {
    emit(text);
    return;
  }
  if (scratch->segments.size() < stages_.size()) {
    scratch->segments.resize(stages_.size());
    scratch->prefixed.resize(stages_.size());
    scratch->mapped.resize(stages_.size());
  }
  RunStage(0, text, at_start, scratch, emit);
}

void PreTokenizer::RunStage(size_t i, std::string_view piece, bool at_start, Scratch* scratch,
                            absl::FunctionRef<void(std::string_view)> emit) const {
  if (piece.empty()) return;
  if (i == stages_.size()) {
    emit(piece);
    return;
  }
  const Stage& st = stages_[i];
  std::vector<Segment>& segs = scratch->segments[i];
  switch (st.kind) {
    case Kind::kSplit: {
      st.pattern->FindMatches(piece, &segs);
      ApplyBehavior(st.behavior, st.invert, &segs);
      for (size_t k = 0; k < segs.size(); ++k) {
        const Segment s = segs[k];
        if (s.is_match) continue;
        RunStage(i + 1, piece.substr(s.start, s.end - s.start), at_start && s.start == 0, scratch, emit);
      }
      return;
    }
    case Kind::kByteLevel: {
      std::string_view p = piece;
      if (st.add_prefix_space && p.front() != ' ') {
        std::string& buf = scratch->prefixed[i];
        buf.clear();
        buf.push_back(' ');
        buf.append(p);
        p = buf;
      }
      std::string& mapped = scratch->mapped[i];
      if (!st.pattern) {
        mapped.clear();
        AppendByteLevel(p, &mapped);
        RunStage(i + 1, mapped, at_start, scratch, emit);
        return;
      }
      st.pattern->FindMatches(p, &segs);
      for (size_t k = 0; k < segs.size(); ++k) {
        const Segment s = segs[k];
        mapped.clear();
        AppendByteLevel(p.substr(s.start, s.end - s.start), &mapped);
        RunStage(i + 1, mapped, at_start && s.start == 0, scratch, emit);
      }
      return;
    }
    case Kind::kMetaspace: {
      std::string& buf = scratch->prefixed[i];
      buf.clear();
      for (char c : piece) {
        if (c == ' ') {
          buf.append(st.replacement);
        } else {
          buf.push_back(c);
        }
      }
      const bool needs_prefix = buf.compare(0, st.replacement.size(), st.replacement) != 0;
      if (needs_prefix && (st.prepend == Prepend::kAlways || (st.prepend == Prepend::kFirst && at_start))) {
        buf.insert(0, st.replacement);
      }
      if (!st.split) {
        RunStage(i + 1, buf, at_start, scratch, emit);
        return;
      }
      st.pattern->FindMatches(buf, &segs);
      ApplyBehavior(Behavior::kMergedWithNext, false, &segs);
      const std::string_view whole = buf;
      for (size_t k = 0; k < segs.size(); ++k) {
        const Segment s = segs[k];
        RunStage(i + 1, whole.substr(s.start, s.end - s.start), at_start && s.start == 0, scratch, emit);
      }
      return;
    }
  }
}

}  // namespace tandem::tokenizer
