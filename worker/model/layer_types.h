// Per-layer attention types: a Tandem extension of config.json
// (`tandem_layer_types`, one entry per layer), for hybrid long-context models
// (full attention in a few layers, bounded attention elsewhere):
//
//   "full"               causal attention over every earlier token
//   "window:N"           the last N tokens (i - N < j <= i)
//   "sink:S+window:N"    the first S tokens of the sequence and the last N
//   "linear"             linear attention with a fixed per-head decay
//                        (RetNet: gamma_h = 1 - 2^(-5 - h)); the layer's
//                        q/k/v/o projections are the usual ones, so the
//                        checkpoint layout is the plain Hugging Face one
//
// Parsing and validation live here, apart from the Hugging Face keys; the
// config calls them. Errors name the key, the layer and the entry.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::model {

struct ModelConfig;

enum class LayerKind { kFull, kWindow, kSinkWindow, kLinear };

struct LayerType {
  LayerKind kind = LayerKind::kFull;
  int window = -1;  // kWindow, kSinkWindow: N
  int sinks = 0;    // kSinkWindow: S
  bool operator==(const LayerType&) const = default;
  bool softmax() const { return kind != LayerKind::kLinear; }
  // Keys that a decode step keeps per sequence, or -1 when unbounded.
  int BoundedKeys() const {
    return kind == LayerKind::kWindow ? window : kind == LayerKind::kSinkWindow ? sinks + window : -1;
  }
};

// The config key.
inline constexpr std::string_view kLayerTypesKey = "tandem_layer_types";

// "full", "window:N", "sink:S+window:N" or "linear" (N, S positive).
absl::StatusOr<LayerType> ParseLayerType(std::string_view text);
std::string LayerTypeName(const LayerType& type);

// Checks `tandem_layer_types` against the rest of the config: one entry per
// layer, each valid; windows within max_position_embeddings; linear layers
// need num_key_value_heads == num_attention_heads; no Hugging Face
// sliding-window key may give a layer a window at the same time (one
// description per layer). OK when the key is absent.
absl::Status ValidateLayerTypes(const ModelConfig& config);

// The type of layer l: from tandem_layer_types when given, else full or
// window:N as the Hugging Face keys say. Assumes the config is valid.
LayerType LayerTypeOf(const ModelConfig& config, int layer);

// Log of the fixed per-head decay of linear layers, head h of H.
double LinearLogDecay(int head);

}  // namespace tandem::model
