// Fuzz target: JSONL data rows (worker/rl), as a job's data.train file is
// read. Input: the file's text (one row or a few lines). It is read as SFT
// data with the char tokenizer (SftDataset::FromJsonlText) and as text
// data (TextDataset::FromText) three ways: raw prompt + answer rows for
// GRPO with the char tokenizer, chat messages with a response for SFT, and
// prompts as chat user turns, both through a small byte-level Hugging Face
// tokenizer with a ChatML template. Bad rows must fail with "NAME:LINE: ..."
// (or be skipped and counted), never crash.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"
#include "worker/model/tokenizer.h"
#include "worker/rl/sft_data.h"
#include "worker/rl/text_data.h"
#include "worker/text/text_tokenizer.h"

namespace {

using tandem::rl::TextDataOptions;

// The GPT-2 byte-to-character map: byte-level BPE's 256 base tokens.
std::string ByteChar(int b) {
  auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

// A byte-level BPE tokenizer (256 byte tokens, a few merges, ChatML special
// tokens and template) in `dir`.
std::shared_ptr<const tandem::text::Tokenizer> ChatTokenizer(const std::string& dir) {
  using Json = nlohmann::ordered_json;
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  const char* merged[] = {"ĠĠ", "he", "in", "Ġt"};
  int id = 256;
  for (const char* m : merged) vocab[m] = id++;
  Json added = Json::array();
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const Json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  const Json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", added},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", nullptr},
                          {"decoder", byte_level},
                          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"Ġ Ġ", "h e", "i n", "Ġ t"}}}}};
  const Json config = {
      {"eos_token", "<|im_end|>"},
      {"pad_token", "<|endoftext|>"},
      {"chat_template",
       "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
       "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}};
  tandem::fuzz::WriteFileOrDie(dir + "/tokenizer.json", tokenizer.dump());
  tandem::fuzz::WriteFileOrDie(dir + "/tokenizer_config.json", config.dump());
  auto tok = tandem::text::LoadHfTokenizer(dir);
  if (!tok.ok()) tandem::fuzz::Fail("the fixed tokenizer does not load: " + tok.status().ToString());
  return *tok;
}

struct Fixture {
  std::shared_ptr<const tandem::text::Tokenizer> chars = tandem::text::MakeCharTokenizer();
  std::shared_ptr<const tandem::text::Tokenizer> chat = ChatTokenizer(tandem::fuzz::ScratchDir("jsonl_row"));
  tandem::model::CharTokenizer sft_chars = tandem::model::CharTokenizer::Default();
  TextDataOptions grpo, sft_messages, chat_prompt;
  Fixture() {
    grpo.prompt_key = "question";
    grpo.answer_key = "answer";
    grpo.need_answer = true;
    grpo.max_prompt_tokens = 64;
    grpo.truncate_overflow = true;
    sft_messages.messages_key = "messages";
    sft_messages.need_response = true;
    sft_messages.system_prompt = "Be brief.";
    sft_messages.max_sequence_tokens = 4096;
    chat_prompt.prompt_key = "prompt";
    chat_prompt.response_key = "response";
    chat_prompt.chat = true;
    chat_prompt.skip_bad_rows = true;
    chat_prompt.max_prompt_tokens = 32;
  }
};

const Fixture& F() {
  static const Fixture* f = new Fixture();
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)F();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::rl;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Fixture& f = F();
  (void)SftDataset::FromJsonlText(text, "data.jsonl", &f.sft_chars, {.seq_len = 256}, 7);
  (void)TextDataset::FromText(text, "data.jsonl", f.grpo, *f.chars);
  (void)TextDataset::FromText(text, "data.jsonl", f.sft_messages, *f.chat);
  (void)TextDataset::FromText(text, "data.jsonl", f.chat_prompt, *f.chat);
  return 0;
}
