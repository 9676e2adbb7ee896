#include "worker/model/layer_types.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/model/config.h"

namespace tandem::model {
namespace {

// A positive decimal int, the whole text.
bool PositiveInt(std::string_view s, int* out) {
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out > 0;
}

absl::Status BadEntry(std::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", std::string(kLayerTypesKey), "' has '",
                                                 std::string(text),
                                                 "'; expected full, window:N, sink:S+window:N or linear (N, S positive "
                                                 "integers)"));
}

}  // namespace

absl::StatusOr<LayerType> ParseLayerType(std::string_view text) {
  LayerType t;
  if (text == "full") return t;
  if (text == "linear") {
    t.kind = LayerKind::kLinear;
    return t;
  }
  constexpr std::string_view kWindow = "window:", kSink = "sink:";
  if (text.substr(0, kWindow.size()) == kWindow) {
    if (!PositiveInt(text.substr(kWindow.size()), &t.window)) return BadEntry(text);
    t.kind = LayerKind::kWindow;
    return t;
  }
  if (text.substr(0, kSink.size()) == kSink) {
    const std::string_view rest = text.substr(kSink.size());
    const size_t plus = rest.find('+');
    if (plus == std::string_view::npos) return BadEntry(text);
    const std::string_view w = rest.substr(plus + 1);
    if (!PositiveInt(rest.substr(0, plus), &t.sinks) || w.substr(0, kWindow.size()) != kWindow ||
        !PositiveInt(w.substr(kWindow.size()), &t.window)) {
      return BadEntry(text);
    }
    t.kind = LayerKind::kSinkWindow;
    return t;
  }
  return BadEntry(text);
}

std::string LayerTypeName(const LayerType& t) {
  switch (t.kind) {
    case LayerKind::kFull:
      return "full";
    case LayerKind::kWindow:
      return absl::StrCat("window:", t.window);
    case LayerKind::kSinkWindow:
      return absl::StrCat("sink:", t.sinks, "+window:", t.window);
    case LayerKind::kLinear:
      return "linear";
  }
  return "full";
}

absl::Status ValidateLayerTypes(const ModelConfig& c) {
  if (c.tandem_layer_types.empty()) return absl::OkStatus();
  const std::string key(kLayerTypesKey);
  if (static_cast<int>(c.tandem_layer_types.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' has ", c.tandem_layer_types.size(),
                                                   " entries; must have num_hidden_layers (", c.num_hidden_layers,
                                                   ")"));
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    absl::StatusOr<LayerType> t = ParseLayerType(c.tandem_layer_types[l]);
    if (!t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(t.status().message(), " (layer ", l, ")"));
    }
    if (t->window > c.max_position_embeddings || t->sinks > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' layer ", l, " '", c.tandem_layer_types[l],
                                                     "': window and sinks must be <= max_position_embeddings (",
                                                     c.max_position_embeddings, ")"));
    }
    if (t->kind == LayerKind::kLinear && c.KvHeads() != c.num_attention_heads) {
      return absl::InvalidArgumentError(absl::StrCat("config key '", key, "' layer ", l,
                                                     " 'linear' needs num_key_value_heads (", c.KvHeads(),
                                                     ") == num_attention_heads (", c.num_attention_heads, ")"));
    }
    if (c.LayerWindow(l) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("config key '", key,
                                                     "' cannot be combined with Hugging Face "
                                                     "sliding-window keys (layer_types, sliding_window, "
                                                     "use_sliding_window) that give layer ",
                                                     l, " a window of ", c.LayerWindow(l),
                                                     "; set sliding_window to null and describe every "
                                                     "layer in ",
                                                     key));
    }
  }
  return absl::OkStatus();
}

LayerType LayerTypeOf(const ModelConfig& c, int layer) {
  if (!c.tandem_layer_types.empty()) {
    absl::StatusOr<LayerType> t = ParseLayerType(c.tandem_layer_types[layer]);
    return t.ok() ? *t : LayerType{};
  }
  LayerType t;
  const int w = c.LayerWindow(layer);
  if (w > 0) {
    t.kind = LayerKind::kWindow;
    t.window = w;
  }
  return t;
}

double LinearLogDecay(int head) { return std::log1p(-std::exp2(-5.0 - head)); }

}  // namespace tandem::model
