// Verifiable rewards: see rewards.h.
#include "worker/rl/rewards.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::rl {

// A compiled PCRE2 pattern with bounded matching (no catastrophic
// backtracking): owns its code.
class Pcre2Pattern {
 public:
  static absl::StatusOr<std::unique_ptr<Pcre2Pattern>> Compile(const std::string& pattern, std::string_view field) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": bad regular expression at offset ", offset,
                                                     ": ", reinterpret_cast<const char*>(msg)));
    }
    auto p = std::unique_ptr<Pcre2Pattern>(new Pcre2Pattern());
    p->code_ = code;
    p->context_ = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(p->context_, 1000000);
    pcre2_set_depth_limit(p->context_, 10000);
    return p;
  }
  ~Pcre2Pattern() {
    pcre2_match_context_free(context_);
    pcre2_code_free(code_);
  }
  Pcre2Pattern(const Pcre2Pattern&) = delete;
  Pcre2Pattern& operator=(const Pcre2Pattern&) = delete;

  // The last match's first group (whole match without groups); nullopt when
  // nothing matches (or matching hit its limits, or the text is not UTF-8).
  std::optional<std::string> LastMatch(std::string_view text) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    std::optional<std::string> out;
    PCRE2_SIZE start = 0;
    while (start <= text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, md, context_);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const int group = rc > 1 ? 1 : 0;
      if (ov[2 * group] != PCRE2_UNSET) {
        out = std::string(text.substr(ov[2 * group], ov[2 * group + 1] - ov[2 * group]));
      } else {
        out = std::string();
      }
      size_t next = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
      // Step over a whole UTF-8 character after an empty match.
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      start = next;
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  Pcre2Pattern() = default;
  pcre2_code* code_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// text[i] is a thousands comma: exactly three digits follow it.
bool ThousandsCommaAt(std::string_view text, size_t i) {
  return text[i] == ',' && i + 3 < text.size() && IsDigit(text[i + 1]) && IsDigit(text[i + 2]) &&
         IsDigit(text[i + 3]) && (i + 4 >= text.size() || !IsDigit(text[i + 4]));
}

std::string_view Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void ReplaceAll(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// Numbers in `text`, in order, as written ("-1,234.50"): an optional minus
// sign, digits with thousands commas (a comma only before exactly three
// digits), an optional fraction.
std::vector<std::string> Numbers(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    if (!IsDigit(text[i])) {
      ++i;
      continue;
    }
    size_t b = i;
    // ".5": a fraction without its leading zero.
    if (b > 0 && text[b - 1] == '.' && (b < 2 || !IsDigit(text[b - 2]))) --b;
    if (b > 0 && text[b - 1] == '-') --b;
    size_t e = i;
    while (e < text.size()) {
      if (IsDigit(text[e])) {
        ++e;
      } else if (ThousandsCommaAt(text, e)) {
        e += 4;
      } else {
        break;
      }
    }
    if (e + 1 < text.size() && text[e] == '.' && IsDigit(text[e + 1])) {
      ++e;
      while (e < text.size() && IsDigit(text[e])) ++e;
    }
    out.emplace_back(text.substr(b, e - b));
    i = e;
  }
  return out;
}

std::optional<double> ParseDouble(std::string_view s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  std::string t(s);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  // strtod accepts hex, inf and exponents; answers are plain decimals.
  for (char c : t) {
    if (!IsDigit(c) && c != '.' && c != '-' && c != '+') return std::nullopt;
  }
  return v;
}

// Content of the balanced {...} group starting at text[open] == '{'.
std::optional<std::string> BracedGroup(std::string_view text, size_t open, size_t* close = nullptr) {
  if (open >= text.size() || text[open] != '{') return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '{' || text[i + 1] == '}')) {
      ++i;  // escaped brace
      continue;
    }
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) {
      if (close) *close = i;
      return std::string(text.substr(open + 1, i - open - 1));
    }
  }
  return std::nullopt;
}

// Replaces every \cmd{X} with X (keep) or with nothing.
void UnwrapCommand(std::string& s, std::string_view cmd, bool keep) {
  size_t pos = 0;
  while ((pos = s.find(cmd, pos)) != std::string::npos) {
    size_t open = pos + cmd.size();
    while (open < s.size() && s[open] == ' ') ++open;
    size_t close = 0;
    auto inner = BracedGroup(s, open, &close);
    if (!inner) {
      pos += cmd.size();
      continue;
    }
    s.replace(pos, close + 1 - pos, keep ? *inner : std::string());
  }
}

// \frac12 -> \frac{1}{2}, \frac1{b} -> \frac{1}{b}, \sqrt3 -> \sqrt{3}.
void BraceShortArgs(std::string& s, std::string_view cmd, int args) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, cmd.size(), cmd) != 0) {
      out.push_back(s[i++]);
      continue;
    }
    out.append(cmd);
    i += cmd.size();
    for (int a = 0; a < args && i < s.size(); ++a) {
      if (s[i] == '{') {
        size_t close = 0;
        auto g = BracedGroup(s, i, &close);
        if (!g) break;
        out.append(s, i, close + 1 - i);
        i = close + 1;
      } else {
        out.push_back('{');
        out.push_back(s[i++]);
        out.push_back('}');
      }
    }
  }
  s = std::move(out);
}

// Value of a normalised answer that reads as a number: a decimal, or
// \frac{a}{b} / -\frac{a}{b} with decimal a and b.
std::optional<double> MathValue(std::string_view s) {
  if (auto v = ParseDouble(s)) return v;
  double sign = 1;
  if (!s.empty() && s[0] == '-') {
    sign = -1;
    s.remove_prefix(1);
  }
  if (s.rfind("\\frac{", 0) != 0) return std::nullopt;
  size_t close1 = 0, close2 = 0;
  auto num = BracedGroup(s, 5, &close1);
  if (!num) return std::nullopt;
  auto den = BracedGroup(s, close1 + 1, &close2);
  if (!den || close2 + 1 != s.size()) return std::nullopt;
  auto a = ParseDouble(*num);
  auto b = ParseDouble(*den);
  if (!a || !b || *b == 0) return std::nullopt;
  return sign * *a / *b;
}

}  // namespace

std::string NormalizeNumber(std::string_view number) {
  std::string s;
  for (char c : Trim(number)) {
    if (c != ',' && c != '$' && c != ' ') s.push_back(c);
  }
  while (!s.empty() && s.back() == '.') s.pop_back();
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::optional<std::string> Gsm8kResponseAnswer(std::string_view response) {
  const size_t marker = response.rfind("####");
  if (marker != std::string_view::npos) {
    auto nums = Numbers(response.substr(marker + 4));
    if (!nums.empty()) return NormalizeNumber(nums.front());
  }
  auto nums = Numbers(response);
  if (nums.empty()) return std::nullopt;
  return NormalizeNumber(nums.back());
}

std::string Gsm8kReferenceAnswer(std::string_view reference) {
  const size_t marker = reference.rfind("####");
  std::string_view ans = marker == std::string_view::npos ? reference : reference.substr(marker + 4);
  return NormalizeNumber(ans);
}

std::optional<std::string> LastBoxed(std::string_view text) {
  size_t best = std::string_view::npos;
  size_t cmd_len = 0;
  for (std::string_view cmd : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    const size_t p = text.rfind(cmd);
    if (p != std::string_view::npos && (best == std::string_view::npos || p > best)) {
      best = p;
      cmd_len = cmd.size();
    }
  }
  if (best == std::string_view::npos) return std::nullopt;
  size_t i = best + cmd_len;
  if (i < text.size() && text[i] == '{') return BracedGroup(text, i);
  if (i < text.size() && text[i] == ' ') {
    // "\boxed 5": up to the next space or '$'.
    while (i < text.size() && text[i] == ' ') ++i;
    size_t e = i;
    while (e < text.size() && text[e] != ' ' && text[e] != '$') ++e;
    if (e > i) return std::string(text.substr(i, e - i));
  }
  return std::nullopt;
}

std::string NormalizeMathAnswer(std::string_view answer) {
  std::string s(Trim(answer));
  ReplaceAll(s, "\n", "");
  ReplaceAll(s, "\\!", "");
  ReplaceAll(s, "\\,", "");
  ReplaceAll(s, "\\;", "");
  ReplaceAll(s, "\\dfrac", "\\frac");
  ReplaceAll(s, "\\tfrac", "\\frac");
  ReplaceAll(s, "\\left", "");
  ReplaceAll(s, "\\right", "");
  ReplaceAll(s, "^{\\circ}", "");
  ReplaceAll(s, "^\\circ", "");
  ReplaceAll(s, "\\%", "");
  ReplaceAll(s, "%", "");
  ReplaceAll(s, "\\$", "");
  ReplaceAll(s, "$", "");
  // A trailing \text{...} after something else is a unit; other \text{X}
  // and \mbox{X} are X.
  for (std::string_view cmd : {std::string_view("\\text"), std::string_view("\\mbox")}) {
    const size_t p = s.rfind(cmd);
    if (p != std::string::npos && p > 0) {
      size_t open = p + cmd.size();
      while (open < s.size() && s[open] == ' ') ++open;
      size_t close = 0;
      std::string before = s.substr(0, p);
      if (BracedGroup(s, open, &close) && close + 1 == s.size() && !Trim(before).empty()) {
        s = std::string(Trim(before));
      }
    }
    UnwrapCommand(s, cmd, /*keep=*/true);
  }
  // "x = 5" -> "5" (a short left-hand side only).
  if (size_t eq = s.find('='); eq != std::string::npos && s.find('=', eq + 1) == std::string::npos &&
                               Trim(std::string_view(s).substr(0, eq)).size() <= 2) {
    s = std::string(Trim(std::string_view(s).substr(eq + 1)));
  }
  std::string nospace;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) nospace.push_back(c);
  }
  s = std::move(nospace);
  BraceShortArgs(s, "\\frac", 2);
  BraceShortArgs(s, "\\sqrt", 1);
  // Thousands commas inside numbers: 1,000 -> 1000.
  {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i > 0 && IsDigit(s[i - 1]) && ThousandsCommaAt(s, i)) {
        continue;
      }
      out.push_back(s[i]);
    }
    s = std::move(out);
  }
  // .5 -> 0.5
  if (!s.empty() && s[0] == '.') s = "0" + s;
  ReplaceAll(s, "{.", "{0.");
  // a/b of two integers -> \frac{a}{b}
  if (size_t slash = s.find('/'); slash != std::string::npos && s.find('/', slash + 1) == std::string::npos) {
    std::string a = s.substr(0, slash), b = s.substr(slash + 1);
    bool neg = !a.empty() && a[0] == '-';
    std::string_view digits_a = std::string_view(a).substr(neg ? 1 : 0);
    auto all_digits = [](std::string_view x) {
      if (x.empty()) return false;
      for (char c : x) {
        if (!IsDigit(c)) return false;
      }
      return true;
    };
    if (all_digits(digits_a) && all_digits(b)) {
      s = std::string(neg ? "-" : "") + "\\frac{" + std::string(digits_a) + "}{" + b + "}";
    }
  }
  // Trailing zeros of a plain decimal: 2.50 -> 2.5, 3.0 -> 3.
  if (ParseDouble(s)) s = NormalizeNumber(s);
  return s;
}

bool MathAnswersEqual(std::string_view a, std::string_view b) {
  const std::string na = NormalizeMathAnswer(a), nb = NormalizeMathAnswer(b);
  if (na == nb) return !na.empty();
  auto va = MathValue(na), vb = MathValue(nb);
  if (va && vb) return std::abs(*va - *vb) <= 1e-9 * std::max(1.0, std::abs(*va));
  return false;
}

VerifiableReward::~VerifiableReward() = default;

absl::StatusOr<std::unique_ptr<VerifiableReward>> VerifiableReward::Create(const RewardOptions& options) {
  auto r = std::unique_ptr<VerifiableReward>(new VerifiableReward());
  r->options_ = options;
  const std::string& t = options.type;
  if (t != "gsm8k" && t != "math" && t != "exact" && t != "regex") {
    return absl::InvalidArgumentError(
        absl::StrCat("reward.type: '", t, "' is not allowed; allowed: gsm8k, math, exact, regex"));
  }
  if (!(options.format_reward >= 0) || !std::isfinite(options.format_reward)) {
    return absl::InvalidArgumentError("reward.format_reward: must be a finite number >= 0");
  }
  if (t == "regex") {
    if (options.pattern.empty()) return absl::InvalidArgumentError("reward.pattern: required with type regex");
    ASSIGN_OR_RETURN(r->pattern_, Pcre2Pattern::Compile(options.pattern, "reward.pattern"));
  } else if (!options.pattern.empty()) {
    return absl::InvalidArgumentError("reward.pattern: only for type regex");
  }
  if (!options.format_pattern.empty()) {
    ASSIGN_OR_RETURN(r->format_, Pcre2Pattern::Compile(options.format_pattern, "reward.format_pattern"));
  }
  return r;
}

std::optional<std::string> VerifiableReward::ExtractAnswer(std::string_view response) const {
  const std::string& t = options_.type;
  if (t == "gsm8k") return Gsm8kResponseAnswer(response);
  if (t == "math") return LastBoxed(response);
  if (t == "exact") return std::string(Trim(response));
  auto m = pattern_->LastMatch(response);
  if (!m) return std::nullopt;
  return std::string(Trim(*m));
}

RewardResult VerifiableReward::Score(std::string_view response, std::string_view reference) const {
  RewardResult r;
  const std::string& t = options_.type;
  const std::optional<std::string> answer = ExtractAnswer(response);
  if (t == "gsm8k") {
    const std::string ref = Gsm8kReferenceAnswer(reference);
    r.correct = answer && !ref.empty() && *answer == ref;
    if (!r.correct && answer && !ref.empty()) {
      auto a = ParseDouble(*answer), b = ParseDouble(ref);
      r.correct = a && b && *a == *b;
    }
    const size_t marker = response.rfind("####");
    r.well_formed = marker != std::string_view::npos && !Numbers(response.substr(marker + 4)).empty();
  } else if (t == "math") {
    auto boxed_ref = LastBoxed(reference);
    const std::string ref = boxed_ref ? *boxed_ref : std::string(Trim(reference));
    r.correct = answer && MathAnswersEqual(*answer, ref);
    r.well_formed = answer.has_value();
  } else if (t == "exact") {
    r.correct = Trim(response) == Trim(reference);
    r.well_formed = !Trim(response).empty();
  } else {
    r.correct = answer && *answer == Trim(reference);
    r.well_formed = answer.has_value();
  }
  if (format_) r.well_formed = format_->LastMatch(response).has_value();
  r.reward = (r.correct ? 1.0 : 0.0) + (r.well_formed ? options_.format_reward : 0.0);
  return r;
}

}  // namespace tandem::rl
