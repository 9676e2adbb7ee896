#include "worker/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {

namespace {

// JIT stack bounds: enough for the tokenizer patterns on inputs of any
// size (their repeats do not nest); a pattern that needs more fails the
// match instead of growing without bound.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 8 * 1024 * 1024;

[[noreturn]] void OutOfMemory(const char* what) {
  std::fprintf(stderr, "tokenizer regex: cannot allocate %s\n", what);
  std::abort();
}

// Per-thread match state, shared by every pattern: the ovector only needs
// the whole match.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    if (data == nullptr || context == nullptr || jit_stack == nullptr) OutOfMemory("match data");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

std::string ErrorText(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return absl::StrCat("error ", code);
  return std::string(reinterpret_cast<const char*>(buf));
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

absl::StatusOr<Regex> Regex::Compile(std::string_view pattern, bool literal) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("regex does not compile: ", ErrorText(error), " at offset ", offset));
  }
  Regex r;
  auto holder = std::make_shared<Code>();
  holder->code = code;
  uint32_t have_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
  r.jit_ = have_jit != 0 && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  r.code_ = std::move(holder);
  r.pattern_ = std::string(pattern);
  return r;
}

bool Regex::Find(std::string_view subject, size_t from, size_t* start, size_t* end) const {
  ThreadMatchState& st = MatchState();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code_->code, s, subject.size(), from, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter keeps its backtracking state on the heap instead.
      rc = pcre2_match(code_->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, st.data, st.context);
    }
  } else {
    rc = pcre2_match(code_->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, st.data, st.context);
  }
  if (rc < 0) return false;  // no match, or a resource limit: see the header
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  if (ov[0] > ov[1]) return false;  // \K can set the start past the end
  *start = ov[0];
  *end = ov[1];
  return true;
}

size_t Regex::Utf8Advance(std::string_view s, size_t pos) {
  return static_cast<size_t>(Utf8LeadLength(static_cast<unsigned char>(s[pos])));
}

}  // namespace tandem::tokenizer
