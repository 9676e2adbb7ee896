// Fuzz target: a Hugging Face chat template (worker/chat_template), parsed
// and rendered as every chat-formatted prompt is. Input: the template
// source, then optionally NUL and the messages (a JSON array), then
// optionally NUL and the extra variables (a JSON object); without them, a
// fixed conversation and the usual special tokens. The JSON goes through
// the strict parser, as data rows do before they reach a template. Limits
// are lowered from the defaults so that one input stays fast; a template
// that exceeds them must fail with ResourceExhausted, never crash.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/chat_template/chat_template.h"
#include "worker/model/strict_json.h"

namespace {

using Json = nlohmann::ordered_json;

const char kMessages[] = R"([
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "What is 2+2?"},
  {"role": "assistant", "content": "4", "tool_calls": [{"type": "function",
   "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}]},
  {"role": "tool", "content": "4"},
  {"role": "user", "content": "And 3+3? caf\u00e9 \"quoted\" <tag>"}])";
const char kExtra[] = R"({"bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false,
  "tools": [{"type": "function", "function": {"name": "add", "description": "a + b",
   "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]})";

Json ParseOr(const std::vector<std::string>& parts, size_t i, const char* fallback) {
  if (i < parts.size()) {
    auto j = tandem::model::ParseStrictOrderedJson(parts[i], "fuzz input");
    if (j.ok()) return *std::move(j);
  }
  return Json::parse(fallback);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::chat_template::ChatTemplate;
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), absl::MaxSplits('\0', 2));
  tandem::chat_template::Limits limits;
  limits.max_output_bytes = size_t{1} << 20;
  limits.max_loop_iterations = 100'000;
  limits.max_steps = 2'000'000;
  auto tmpl = ChatTemplate::Parse(parts[0], limits);
  if (!tmpl.ok()) return 0;
  tmpl->set_clock([] {
    std::tm t{};
    t.tm_year = 124;
    t.tm_mon = 6;
    t.tm_mday = 26;
    return t;
  });
  const Json messages = ParseOr(parts, 1, kMessages);
  const Json extra = ParseOr(parts, 2, kExtra);
  for (bool generation_prompt : {true, false}) {
    auto out = tmpl->Render(messages, generation_prompt, extra.is_object() ? extra : Json::object());
    if (out.ok() && out->size() > limits.max_output_bytes) {
      tandem::fuzz::Fail("a render is longer than max_output_bytes");
    }
  }
  return 0;
}
