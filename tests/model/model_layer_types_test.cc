// Per-layer attention types (`tandem_layer_types`, worker/model/layer_types.h):
// parsing of each entry, the refusals (each naming the key and the layer),
// the round trip through config.json, and how the HF keys map to types.
#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/layer_types.h"

namespace tandem::model {
namespace {

using nlohmann::json;

json Base() {
  return json{
      {"model_type", "llama"},  {"vocab_size", 100},        {"hidden_size", 32},    {"intermediate_size", 48},
      {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 4096}};
}

TEST(LayerTypesTest, ParsesEveryType) {
  EXPECT_EQ(ParseLayerType("full")->kind, LayerKind::kFull);
  EXPECT_EQ(ParseLayerType("linear")->kind, LayerKind::kLinear);
  auto w = ParseLayerType("window:512");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->kind, LayerKind::kWindow);
  EXPECT_EQ(w->window, 512);
  EXPECT_EQ(w->BoundedKeys(), 512);
  auto s = ParseLayerType("sink:4+window:1020");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->kind, LayerKind::kSinkWindow);
  EXPECT_EQ(s->sinks, 4);
  EXPECT_EQ(s->window, 1020);
  EXPECT_EQ(s->BoundedKeys(), 1024);
  for (const char* t : {"full", "linear", "window:7", "sink:1+window:2"})
    EXPECT_EQ(LayerTypeName(*ParseLayerType(t)), t);
  for (const char* bad : {"", "Full", "window", "window:", "window:0", "window:-3", "window:12x", "sink:4",
                          "sink:0+window:5", "sink:4+window:0", "sink:4+5", "window:4+sink:2", "sliding_attention"}) {
    const auto st = ParseLayerType(bad).status();
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("tandem_layer_types"), std::string::npos) << st;
  }
}

TEST(LayerTypesTest, HybridConfigRoundTrips) {
  json j = Base();
  j["tandem_layer_types"] = {"window:256", "full", "linear", "sink:4+window:252"};
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(LayerTypeOf(*c, 0), (LayerType{LayerKind::kWindow, 256, 0}));
  EXPECT_EQ(LayerTypeOf(*c, 1), LayerType{});
  EXPECT_EQ(LayerTypeOf(*c, 2).kind, LayerKind::kLinear);
  EXPECT_EQ(LayerTypeOf(*c, 3), (LayerType{LayerKind::kSinkWindow, 252, 4}));
  auto c2 = ParseConfigJson(ToConfigJson(*c));
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(c2->tandem_layer_types, c->tandem_layer_types);
}

TEST(LayerTypesTest, HfWindowsMapToWindowTypes) {
  json j = Base();
  j["model_type"] = "mistral";
  j["sliding_window"] = 64;
  auto c = ParseConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < 4; ++l) EXPECT_EQ(LayerTypeOf(*c, l), (LayerType{LayerKind::kWindow, 64, 0}));
}

TEST(LayerTypesTest, RefusesBadValuesNamingKeyAndLayer) {
  struct Case {
    const char* what;
    json types;
    void (*edit)(json&);
    const char* expect;
  };
  const Case cases[] = {
      {"not a list", "full", nullptr, "must be a list of strings"},
      {"not strings", {1, 2, 3, 4}, nullptr, "must be a list of strings"},
      {"too short", {"full", "full"}, nullptr, "has 2 entries; must have num_hidden_layers (4)"},
      {"bad entry", {"full", "full", "local:5", "full"}, nullptr, "'local:5'"},
      {"bad entry layer", {"full", "full", "window:0", "full"}, nullptr, "(layer 2)"},
      {"window too long", {"full", "window:5000", "full", "full"}, nullptr, "must be <= max_position_embeddings"},
      {"linear with gqa",
       {"linear", "full", "full", "full"},
       [](json& j) { j["num_key_value_heads"] = 2; },
       "'linear' needs num_key_value_heads"},
      {"with HF layer_types",
       {"full", "full", "full", "full"},
       [](json& j) {
         j["sliding_window"] = 16;
         j["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
       },
       "cannot be combined with Hugging Face sliding-window keys"},
      {"mistral default window",
       {"full", "linear", "full", "full"},
       [](json& j) { j["model_type"] = "mistral"; },
       "set sliding_window to null"},
  };
  for (const Case& c : cases) {
    json j = Base();
    j["tandem_layer_types"] = c.types;
    if (c.edit != nullptr) c.edit(j);
    auto r = ParseConfigJson(j.dump());
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_NE(r.status().message().find("tandem_layer_types"), std::string::npos) << c.what << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.what << ": " << r.status();
  }
  // A Mistral config that nulls its window may use the Tandem key.
  json j = Base();
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  j["tandem_layer_types"] = {"full", "linear", "window:8", "full"};
  EXPECT_TRUE(ParseConfigJson(j.dump()).ok());
}

TEST(LayerTypesTest, LinearDecayIsRetNets) {
  EXPECT_DOUBLE_EQ(std::exp(LinearLogDecay(0)), 1.0 - 1.0 / 32);
  EXPECT_DOUBLE_EQ(std::exp(LinearLogDecay(3)), 1.0 - 1.0 / 256);
}

}  // namespace
}  // namespace tandem::model
