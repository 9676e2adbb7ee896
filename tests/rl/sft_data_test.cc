// SFT data: JSONL loading and errors, packing layout, deterministic global
// batches whose union over ranks does not depend on the world size.
#include "worker/rl/sft_data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace tandem::rl {
namespace {

const model::CharTokenizer kTok = model::CharTokenizer::Default();

std::string Error(std::string_view text, SftTokens tokens = {}, const model::CharTokenizer* tok = &kTok) {
  auto d = SftDataset::FromJsonlText(text, "data.jsonl", tok, tokens, 0);
  EXPECT_FALSE(d.ok());
  return d.ok() ? "" : std::string(d.status().message());
}

bool Contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

TEST(PackSftTest, Layout) {
  const std::vector<SftExample> ex = {{{10, 11}, {20}}, {{}, {30, 31}}};
  const PackedBatch b = PackSft(ex, /*bos=*/1, /*eos=*/2);
  EXPECT_EQ(b.num_sequences, 2);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{1, 10, 11, 20, 2, 1, 30, 31, 2}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{10, 11, 20, 2, 0, 30, 31, 2, 0}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3}));
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 5, 9}));
  EXPECT_EQ(b.loss_mask, (std::vector<float>{0, 0, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(b.max_seqlen(), 5);
  float masked = 0;
  for (float m : b.loss_mask) masked += m;
  EXPECT_EQ(masked, CountLossTokens(ex));
}

// A soft prompt's ids start every sequence, before the bos: no loss on
// them and no target that is one of them.
TEST(PackSftTest, SoftPromptPrefix) {
  const std::vector<SftExample> ex = {{{10}, {20}}};
  const std::vector<int32_t> soft = {99, 100};
  const PackedBatch b = PackSft(ex, /*bos=*/1, /*eos=*/2, soft);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{99, 100, 1, 10, 20, 2}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{0, 1, 10, 20, 2, 0}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(b.loss_mask, (std::vector<float>{0, 0, 0, 1, 1, 0}));
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 6}));
}

TEST(SftDatasetTest, AllJsonlForms) {
  const char* text =
      "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n"
      "\n"
      "{\"text\": \"hi\\n\"}\r\n"
      "{\"prompt_ids\": [5, 6], \"completion_ids\": [7]}\n"
      "{\"ids\": [8, 9, 10]}";
  auto d = SftDataset::FromJsonlText(text, "data.jsonl", &kTok, {}, 3);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 4);
  // One epoch of 4 positions visits each line once.
  std::set<std::vector<int32_t>> seen;
  for (int i = 0; i < 4; ++i) {
    SftExample ex = d->Get(0, i, 4);
    std::vector<int32_t> all = ex.prompt_ids;
    all.push_back(-1);
    all.insert(all.end(), ex.completion_ids.begin(), ex.completion_ids.end());
    seen.insert(all);
  }
  EXPECT_EQ(seen.size(), 4u);
  auto enc = [](std::string_view s) { return kTok.Encode(s); };
  std::vector<int32_t> first = enc("1+1=");
  first.push_back(-1);
  for (int32_t id : enc("2")) first.push_back(id);
  EXPECT_TRUE(seen.count(first));
  std::vector<int32_t> text_form = {-1};
  for (int32_t id : enc("hi\n")) text_form.push_back(id);
  EXPECT_TRUE(seen.count(text_form));
  EXPECT_TRUE(seen.count({5, 6, -1, 7}));
  EXPECT_TRUE(seen.count({-1, 8, 9, 10}));
}

TEST(SftDatasetTest, ErrorsNameTheLine) {
  EXPECT_TRUE(Contains(Error(""), "no examples"));
  EXPECT_TRUE(Contains(Error("\n  \n"), "no examples"));
  std::string e = Error("{\"text\": \"a\"}\n{\"text\": \"b\"\n");
  EXPECT_TRUE(Contains(e, "data.jsonl:2:")) << e;
  EXPECT_TRUE(Contains(e, "not valid JSON")) << e;
  e = Error("{\"prompt\": 3, \"completion\": \"x\"}");
  EXPECT_TRUE(Contains(e, "data.jsonl:1:") && Contains(e, "must be a string")) << e;
  e = Error("{\"prompt\": \"x\"}");
  EXPECT_TRUE(Contains(e, "exactly")) << e;
  e = Error("{\"text\": \"x\", \"label\": 1}");
  EXPECT_TRUE(Contains(e, "unknown key \"label\"")) << e;
  e = Error("[1, 2]");
  EXPECT_TRUE(Contains(e, "expected a JSON object")) << e;
  e = Error("{\"ids\": [1, \"2\"]}");
  EXPECT_TRUE(Contains(e, "\"ids\"[1] must be an integer")) << e;
  e = Error("{\"ids\": [1, 99]}");
  EXPECT_TRUE(Contains(e, "outside the vocabulary")) << e;
  e = Error("{\"ids\": []}");
  EXPECT_TRUE(Contains(e, "empty")) << e;
  e = Error("{\"text\": \"caf\xc3\xa9\"}");
  EXPECT_TRUE(Contains(e, "vocabulary")) << e;
  e = Error("{\"text\": \"hello\"}", {}, nullptr);
  EXPECT_TRUE(Contains(e, "no built-in tokenizer")) << e;
  e = Error("{\"text\": \"hello world\"}", {.seq_len = 8});
  EXPECT_TRUE(Contains(e, "train.seq_len 8")) << e;
  e = Error("{}");
  EXPECT_TRUE(Contains(e, "empty object")) << e;
  // A hostile row: deep nesting and duplicate keys are refused, not parsed.
  e = Error("{\"text\": \"a\"}\n{\"ids\": " + std::string(100000, '[') + std::string(100000, ']') + "}\n");
  EXPECT_EQ(e, "data.jsonl:2: row: nested deeper than 64 levels");
  e = Error("{\"ids\": [1], \"ids\": [2]}");
  EXPECT_EQ(e, "data.jsonl:1: row: key 'ids' appears twice in one object");
}

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() / ("tandem_sft_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name, const std::string& body) const {
    const auto p = path_ / name;
    std::ofstream(p, std::ios::binary) << body;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

TEST(SftDatasetTest, FileLoaderBoundsLines) {
  TempDir dir;
  auto d = SftDataset::FromJsonlFile(dir.File("ok.jsonl", "{\"text\": \"ab\"}\n{\"ids\": [4]}\n"), &kTok, {}, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 2);
  d = SftDataset::FromJsonlFile(dir.File("nonl.jsonl", "{\"ids\": [4]}"), &kTok, {}, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 1);
  const std::string huge = "{\"text\": \"x\"}\n{\"text\": \"" + std::string(kMaxLineBytes + 10, 'a') + "\"}\n";
  d = SftDataset::FromJsonlFile(dir.File("long.jsonl", huge), &kTok, {}, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(Contains(std::string(d.status().message()), "long.jsonl:2:")) << d.status();
  EXPECT_TRUE(Contains(std::string(d.status().message()), "longer than"));
  d = SftDataset::FromJsonlFile(dir.File("empty.jsonl", ""), &kTok, {}, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(Contains(std::string(d.status().message()), "no examples"));
  d = SftDataset::FromJsonlFile("/nonexistent/x.jsonl", &kTok, {}, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
}

TEST(SftDatasetTest, FileEpochsArePermutations) {
  std::string text;
  const int n = 37;
  for (int i = 0; i < n; ++i) text += "{\"ids\": [" + std::to_string(i + 3) + "]}\n";
  auto d = SftDataset::FromJsonlText(text, "f", &kTok, {}, 11);
  ASSERT_TRUE(d.ok());
  const int g = 5;  // epochs do not align with steps
  std::vector<uint64_t> order;
  for (int step = 0; order.size() < 3 * n; ++step) {
    for (int i = 0; i < g; ++i) order.push_back(d->SourceIndex(step, i, g));
  }
  for (int e = 0; e < 3; ++e) {
    std::set<uint64_t> epoch(order.begin() + e * n, order.begin() + (e + 1) * n);
    EXPECT_EQ(epoch.size(), static_cast<size_t>(n));
    EXPECT_LT(*epoch.rbegin(), static_cast<uint64_t>(n));
  }
  EXPECT_FALSE(std::equal(order.begin(), order.begin() + n, order.begin() + n));
  // A different seed gives a different order.
  auto d2 = SftDataset::FromJsonlText(text, "f", &kTok, {}, 12);
  ASSERT_TRUE(d2.ok());
  int same = 0;
  for (int i = 0; i < n; ++i) same += d2->SourceIndex(0, i, n) == order[i];
  EXPECT_LT(same, n / 2);
}

TEST(SftDatasetTest, TaskBatchesDoNotDependOnWorldSize) {
  std::shared_ptr<const Task> task = MakeTask({.name = "arithmetic", .digits = 2}).value();
  auto d = SftDataset::FromTask(task, kTok, {.seq_len = 16}, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  const int64_t g = 10;
  for (int64_t step : {0, 3}) {
    const auto global = d->GlobalBatch(step, g);
    const int64_t tokens = CountLossTokens(global);
    for (int world : {1, 2, 3, 4}) {
      std::vector<SftExample> joined;
      for (int r = 0; r < world; ++r) {
        const IndexRange slice = RankSlice(g, r, world);
        for (IndexRange mb : MicroBatches(slice, 2)) {
          EXPECT_LE(mb.size(), 2);
          auto part = d->Batch(step, g, mb.begin, mb.end);
          joined.insert(joined.end(), part.begin(), part.end());
        }
      }
      ASSERT_EQ(joined.size(), global.size());
      for (size_t i = 0; i < global.size(); ++i) {
        EXPECT_EQ(joined[i].prompt_ids, global[i].prompt_ids);
        EXPECT_EQ(joined[i].completion_ids, global[i].completion_ids);
      }
      EXPECT_EQ(CountLossTokens(joined), tokens);
    }
  }
  // Example i of step s is Sample(seed, s * G + i).
  const Example ex = task->Sample(5, 3 * g + 7);
  EXPECT_EQ(d->Get(3, 7, g).prompt_ids, kTok.Encode(ex.prompt));
  EXPECT_EQ(d->Get(3, 7, g).completion_ids, kTok.Encode(ex.answer));
  // seq_len too short for the task.
  auto bad = SftDataset::FromTask(task, kTok, {.seq_len = 6}, 5);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "train.seq_len"));
}

TEST(SftSlicingTest, RankSliceAndMicroBatches) {
  EXPECT_EQ(RankSlice(10, 0, 3), (IndexRange{0, 3}));
  EXPECT_EQ(RankSlice(10, 1, 3), (IndexRange{3, 6}));
  EXPECT_EQ(RankSlice(10, 2, 3), (IndexRange{6, 10}));
  EXPECT_EQ(RankSlice(2, 2, 3), (IndexRange{1, 2}));
  EXPECT_EQ(RankSlice(2, 0, 3).size(), 0);
  const auto mbs = MicroBatches({3, 10}, 3);
  ASSERT_EQ(mbs.size(), 3u);
  EXPECT_EQ(mbs[2], (IndexRange{9, 10}));
  EXPECT_TRUE(MicroBatches({4, 4}, 3).empty());
}

}  // namespace
}  // namespace tandem::rl
