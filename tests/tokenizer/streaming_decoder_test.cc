// StreamingDecoder: fed the ids of a generation one at a time, the pieces it
// returns (and the final Flush) add up to exactly Decode of all the ids, and
// no piece is broken UTF-8; on the real tokenizers, for the corpus, random
// text and random id sequences (which split characters across tokens and
// leave byte tokens unfinished).
#include "worker/tokenizer/streaming_decoder.h"

#include <gtest/gtest.h>

#include "tests/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

using testing::kRealTokenizers;
using testing::RealTokenizer;

class StreamingTest : public ::testing::TestWithParam<RealTokenizer> {
 protected:
  void SetUp() override {
    const std::string dir = testing::ModelDir(GetParam());
    ASSERT_FALSE(dir.empty());
    auto t = HfTokenizer::LoadDir(dir);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::make_unique<HfTokenizer>(std::move(*t));
  }

  // Streams ids through `d`; checks every piece and returns their sum.
  std::string Stream(StreamingDecoder* d, const std::vector<int32_t>& ids) {
    std::string all;
    for (int32_t id : ids) {
      const std::string piece = d->Add(id);
      EXPECT_TRUE(IsValidUtf8(piece));
      all += piece;
    }
    const std::string rest = d->Flush();
    EXPECT_TRUE(IsValidUtf8(rest));
    return all + rest;
  }

  void ExpectStreamsLikeDecode(const std::vector<int32_t>& ids, const std::string& what) {
    for (bool skip : {false, true}) {
      StreamingDecoder d(*tok_, skip);
      const std::string streamed = Stream(&d, ids);
      const std::string decoded = tok_->Decode(ids, skip);
      ASSERT_EQ(streamed, decoded) << what << " (skip_special_tokens " << skip << ")\n  ids "
                                   << testing::IdsToString(ids);
    }
  }

  std::unique_ptr<HfTokenizer> tok_;
};

TEST_P(StreamingTest, EncodedTextStreamsLikeDecode) {
  std::vector<std::string> texts = testing::Corpus();
  for (std::string& t : testing::RandomTexts(4242, 400)) texts.push_back(std::move(t));
  for (size_t i = 0; i < texts.size(); ++i) {
    ExpectStreamsLikeDecode(tok_->Encode(texts[i]), "text " + std::to_string(i));
  }
}

TEST_P(StreamingTest, RandomIdsStreamLikeDecode) {
  testing::Rng rng(17);
  const int32_t n = tok_->vocab_size();
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(1 + rng.Below(200));
    for (int32_t& id : ids) {
      // Mostly low ids: single bytes and byte tokens are among the first.
      id = static_cast<int32_t>(rng.Below(2) ? rng.Below(300) : rng.Below(static_cast<size_t>(n)));
    }
    ExpectStreamsLikeDecode(ids, "trial " + std::to_string(trial));
  }
}

// Token sequences full of what clean_up_tokenization_spaces rewrites
// (" .", " n't", " ' ", ...), split over tokens in every way.
TEST_P(StreamingTest, CleanUpPatternsAcrossTokens) {
  const std::vector<std::string> pieces = {" ",  ".",   " .", "'",    " '", "n", "n't", "'t", "'s", " 's",
                                           "ve", "'ve", "re", " 're", "!",  "?", ",",   " ,", "m",  "'m",
                                           "a",  "e",   "s",  "t",    "v",  "r", "x",   "\n", " ' "};
  std::vector<std::vector<int32_t>> piece_ids;
  for (const std::string& p : pieces) piece_ids.push_back(tok_->Encode(p, false));
  testing::Rng rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int32_t> ids;
    const size_t n = 1 + rng.Below(60);
    for (size_t k = 0; k < n; ++k) {
      const auto& p = piece_ids[rng.Below(piece_ids.size())];
      ids.insert(ids.end(), p.begin(), p.end());
    }
    ExpectStreamsLikeDecode(ids, "trial " + std::to_string(trial));
  }
}

TEST_P(StreamingTest, PartialCharactersAreHeldBack) {
  // An emoji is several tokens in every one of these vocabularies.
  const std::vector<int32_t> ids = tok_->Encode("\U0001FAE0\U0001FAE0 ok", false);
  ASSERT_GE(ids.size(), 3u);
  StreamingDecoder d(*tok_);
  std::string out;
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(d.Add(id));
  pieces.push_back(d.Flush());
  for (const std::string& p : pieces) {
    EXPECT_TRUE(p.empty() || p.find("\U0001FAE0") != std::string::npos || p.find("ok") != std::string::npos || p == " ")
        << nlohmann::json(p).dump();
    out += p;
  }
  EXPECT_EQ(pieces[0], "");
  EXPECT_EQ(out, tok_->Decode(ids));
  // The decoder starts afresh after Flush.
  EXPECT_EQ(Stream(&d, tok_->Encode("again", false)), tok_->Decode(tok_->Encode("again", false)));
}

INSTANTIATE_TEST_SUITE_P(Real, StreamingTest, ::testing::ValuesIn(kRealTokenizers),
                         [](const ::testing::TestParamInfo<RealTokenizer>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace tandem::tokenizer
