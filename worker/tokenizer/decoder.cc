#include "worker/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/tokenizer/byte_level.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// "<0xNN>" -> NN, or -1.
int ByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// The code points of a valid UTF-8 string.
std::vector<std::string_view> Chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const auto n = static_cast<size_t>(Utf8LeadLength(static_cast<unsigned char>(s[i])));
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace

absl::StatusOr<Decoder> Decoder::FromJson(const Json& j, const std::string& path) {
  Decoder d;
  if (j.is_null()) return d;
  d.present_ = true;
  RETURN_IF_ERROR(Append(j, path, &d.steps_));
  for (const Step& s : d.steps_) d.has_byte_fallback_ = d.has_byte_fallback_ || s.kind == Kind::kByteFallback;
  return d;
}

absl::Status Decoder::Append(const Json& j, const std::string& path, std::vector<Step>* steps) {
  ASSIGN_OR_RETURN(const std::string type, ReadType(j, path));
  if (type == "Sequence") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "decoders"}));
    const Json* list = FindField(j, "decoders");
    const std::string list_path = JsonPath(path, "decoders");
    if (list == nullptr || !list->is_array()) {
      return JsonTypeError(list_path, "an array", list ? *list : Json());
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(Append((*list)[i], JsonPath(list_path, i), steps));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    // The pre-tokenizer's options; they do not change decoding.
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "add_prefix_space", "trim_offsets", "use_regex"}));
    for (const char* key : {"add_prefix_space", "trim_offsets", "use_regex"}) {
      RETURN_IF_ERROR(ReadBool(j, path, key, false).status());
    }
    steps->push_back(Step{Kind::kByteLevel});
    return absl::OkStatus();
  }
  if (type == "Replace") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "pattern", "content"}));
    Step s{Kind::kReplace};
    const Json* pattern = FindField(j, "pattern");
    if (pattern == nullptr) return absl::InvalidArgumentError(JsonPath(path, "pattern") + " is missing");
    ASSIGN_OR_RETURN(Pattern p, Pattern::FromJson(*pattern, JsonPath(path, "pattern")));
    s.pattern = std::make_shared<const Pattern>(std::move(p));
    ASSIGN_OR_RETURN(s.text, ReadString(j, path, "content"));
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "ByteFallback" || type == "Fuse") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type"}));
    steps->push_back(Step{type == "Fuse" ? Kind::kFuse : Kind::kByteFallback});
    return absl::OkStatus();
  }
  if (type == "Strip") {
    RETURN_IF_ERROR(CheckFields(j, path, {"type", "content", "start", "stop"}));
    Step s{Kind::kStrip};
    ASSIGN_OR_RETURN(s.text, ReadChar(j, path, "content", " "));
    ASSIGN_OR_RETURN(const int64_t start, ReadInt(j, path, "start", 0, 0, 1 << 20));
    ASSIGN_OR_RETURN(const int64_t stop, ReadInt(j, path, "stop", 0, 0, 1 << 20));
    s.start = static_cast<size_t>(start);
    s.stop = static_cast<size_t>(stop);
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    RETURN_IF_ERROR(
        CheckFields(j, path, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}));
    Step s{Kind::kMetaspace};
    ASSIGN_OR_RETURN(s.text, ReadChar(j, path, "replacement", "\u2581"));
    ASSIGN_OR_RETURN(const std::optional<std::string> scheme, ReadOptionalString(j, path, "prepend_scheme"));
    ASSIGN_OR_RETURN(const bool add_prefix_space, ReadBool(j, path, "add_prefix_space", true));
    RETURN_IF_ERROR(ReadBool(j, path, "split", true).status());
    if (scheme.has_value() && *scheme != "always" && *scheme != "first" && *scheme != "never") {
      return absl::InvalidArgumentError(absl::StrCat(JsonPath(path, "prepend_scheme"), " \"", *scheme,
                                                     "\" is not supported (supported: always, first, never)"));
    }
    s.strip_first = scheme.has_value() ? *scheme != "never" : add_prefix_space;
    steps->push_back(std::move(s));
    return absl::OkStatus();
  }
  return UnsupportedType(path, type, "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence");
}

void Decoder::Apply(const Step& step, std::vector<std::string>* tokens) {
  std::vector<std::string>& t = *tokens;
  switch (step.kind) {
    case Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& tok : t) {
        const size_t mark = bytes.size();
        bool all_mapped = true;
        for (size_t i = 0; i < tok.size() && all_mapped;) {
          int len;
          const int b = ByteLevelByte(DecodeUtf8(std::string_view(tok).substr(i), &len));
          if (b < 0) {
            all_mapped = false;
          } else {
            bytes.push_back(static_cast<char>(b));
          }
          i += static_cast<size_t>(len);
        }
        if (!all_mapped) {
          bytes.resize(mark);
          bytes.append(tok);
        }
      }
      std::string text;
      AppendUtf8Lossy(bytes, &text);
      t.assign(1, std::move(text));
      return;
    }
    case Kind::kReplace:
      for (std::string& tok : t) {
        std::string out;
        step.pattern->ReplaceAll(tok, step.text, &out);
        tok = std::move(out);
      }
      return;
    case Kind::kByteFallback: {
      std::vector<std::string> out;
      out.reserve(t.size());
      std::string run;
      auto flush = [&] {
        if (run.empty()) return;
        if (IsValidUtf8(run)) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
        }
        run.clear();
      };
      for (std::string& tok : t) {
        const int b = ByteToken(tok);
        if (b >= 0) {
          run.push_back(static_cast<char>(b));
        } else {
          flush();
          out.push_back(std::move(tok));
        }
      }
      flush();
      t = std::move(out);
      return;
    }
    case Kind::kFuse: {
      std::string all;
      for (const std::string& tok : t) all.append(tok);
      t.assign(1, std::move(all));
      return;
    }
    case Kind::kStrip:
      for (std::string& tok : t) {
        const std::vector<std::string_view> chars = Chars(tok);
        size_t start_cut = 0;
        for (size_t i = 0; i < step.start && i < chars.size() && chars[i] == step.text; ++i) {
          start_cut = i + 1;
        }
        size_t stop_cut = chars.size();
        for (size_t i = 0; i < step.stop && i < chars.size(); ++i) {
          const size_t index = chars.size() - i - 1;
          if (chars[index] != step.text) break;
          stop_cut = index;
        }
        std::string out;
        for (size_t i = start_cut; i < stop_cut; ++i) out.append(chars[i]);
        tok = std::move(out);
      }
      return;
    case Kind::kMetaspace:
      for (size_t i = 0; i < t.size(); ++i) {
        std::string out;
        for (std::string_view c : Chars(t[i])) {
          if (c != step.text) {
            out.append(c);
          } else if (i != 0 || !step.strip_first) {
            out.push_back(' ');
          }
        }
        t[i] = std::move(out);
      }
      return;
  }
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  std::string out;
  if (!present_) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(tokens[i]);
    }
    return out;
  }
  for (const Step& step : steps_) Apply(step, &tokens);
  for (const std::string& t : tokens) out.append(t);
  return out;
}

}  // namespace tandem::tokenizer
