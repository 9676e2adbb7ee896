// train.trainable patterns over the model's tensor names: matches, the
// per-unit ranges handed to ZeRO, errors that name the pattern.
#include <gtest/gtest.h>

#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/trainable.h"

namespace tandem::model {
namespace {

ModelConfig Tiny(bool tied) {
  auto c = ParseConfigJson(std::string(R"({"model_type": "llama", "vocab_size": 37, "hidden_size": 16,
      "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "tie_word_embeddings": )") +
                           (tied ? "true}" : "false}"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(Trainable, NoPatternsOrAllMatchedMeansEverything) {
  const ParamLayout layout(Tiny(false));
  auto none = TrainableRanges(layout, {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto star = TrainableRanges(layout, {"*"});
  ASSERT_TRUE(star.ok()) << star.status();
  EXPECT_TRUE(star->empty());
  auto count = TrainableCount(layout, {});
  ASSERT_TRUE(count.ok());
  size_t all = 0;
  for (const auto& t : layout.tensors()) all += t.numel;
  EXPECT_EQ(*count, all);
}

TEST(Trainable, RangesCoverExactlyTheMatchedTensors) {
  for (bool tied : {false, true}) {
    const ParamLayout layout(Tiny(tied));
    const std::vector<std::string> patterns = {"model.layers.*.mlp.*_proj.weight", "model.norm.weight"};
    auto ranges = TrainableRanges(layout, patterns);
    ASSERT_TRUE(ranges.ok()) << ranges.status();
    ASSERT_EQ(ranges->size(), static_cast<size_t>(layout.num_units()));
    std::vector<bool> in(layout.total_floats(), false);
    for (int u = 0; u < layout.num_units(); ++u) {
      size_t end = 0;
      for (const UnitRange& r : (*ranges)[u]) {
        EXPECT_GE(r.offset, end);
        end = r.offset + r.size;
        ASSERT_LE(end, layout.unit_size(u));
        for (size_t i = 0; i < r.size; ++i) in[layout.unit_offset(u) + r.offset + i] = true;
      }
    }
    size_t expect = 0;
    for (const auto& t : layout.tensors()) {
      const bool want = t.name.find(".mlp.") != std::string::npos || t.name == "model.norm.weight";
      if (want) expect += t.numel;
      for (size_t i = 0; i < t.numel; ++i) ASSERT_EQ(in[t.offset + i], want) << t.name;
    }
    EXPECT_EQ(*TrainableCount(layout, patterns), expect);
    EXPECT_TRUE((*ranges)[0].empty());  // the embedding is frozen
  }
}

TEST(Trainable, ErrorsNameThePattern) {
  const ParamLayout layout(Tiny(false));
  auto bad = TrainableRanges(layout, {"model.norm.weight", "model.layers.9.*"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"model.layers.9.*\" matches no parameter"), std::string::npos)
      << bad.status();
  auto empty = MatchTrainable(layout, {""});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty pattern"), std::string::npos) << empty.status();
  // lm_head.weight exists only untied.
  EXPECT_TRUE(MatchTrainable(layout, {"lm_head.weight"}).ok());
  EXPECT_FALSE(MatchTrainable(ParamLayout(Tiny(true)), {"lm_head.weight"}).ok());
}

}  // namespace
}  // namespace tandem::model
