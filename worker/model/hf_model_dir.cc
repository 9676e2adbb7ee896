// The Hugging Face model directory (safetensors.h): loading config.json and
// the weights (one file or shards with model.safetensors.index.json) into
// the flat layout, and saving a directory with its weights, configs and
// tokenizer files.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_util.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"
#include "worker/model/strict_json.h"

namespace tandem::model {

namespace {
using nlohmann::json;

absl::Status Bad(const std::string& path, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }
}  // namespace

absl::Status LoadWeights(const std::string& dir, const ModelConfig& config, float* params) {
  namespace fs = std::filesystem;
  const ParamLayout layout(config);
  std::vector<std::string> files;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(single, ec)) {
    files.push_back(single.string());
  } else if (fs::exists(index, ec)) {
    ASSIGN_OR_RETURN(const std::string text, ReadFileToString(index.string()));
    auto parsed = ParseStrictJson(text, "model.safetensors.index.json");
    if (!parsed.ok()) return Bad(index.string(), parsed.status().message());
    json j = std::move(*parsed);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return Bad(index.string(), "not a JSON object with a \"weight_map\" object");
    }
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string() || it.value().get<std::string>().find('/') != std::string::npos) {
        return Bad(index.string(), absl::StrCat("bad file name for '", it.key(), "'"));
      }
      names.insert(it.value().get<std::string>());
    }
    for (const std::string& n : names) files.push_back((fs::path(dir) / n).string());
  } else {
    return absl::NotFoundError(absl::StrCat("no model.safetensors or model.safetensors.index.json in ", dir));
  }
  std::fill(params, params + layout.total_floats(), 0.f);
  std::set<std::string> seen;
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::Open(path));
    for (const auto& [name, info] : f.tensors()) {
      const TensorView* view = layout.Find(name);
      if (view == nullptr) {
        if (name.size() >= 19 && name.ends_with("rotary_emb.inv_freq")) continue;
        if (name == "lm_head.weight" && layout.tied()) {
          const TensorView* emb = layout.Find("model.embed_tokens.weight");
          if (info.shape == emb->shape) continue;  // tied: the embedding is used
        }
        return Bad(path,
                   absl::StrCat("unexpected tensor '", name, "': not part of the model described by config.json (",
                                config.model_type, ", ", config.num_hidden_layers,
                                " layers, tie_word_embeddings=", config.tie_word_embeddings ? "true" : "false",
                                ", q/k/v bias=", config.HasQkvBias() ? "true" : "false",
                                ", q/k norm=", config.HasQkNorm() ? "true" : "false", ")"));
      }
      if (info.shape != view->shape) {
        return Bad(path, absl::StrCat("tensor '", name, "' has shape ", ShapeStr(info.shape),
                                      " but config.json implies ", ShapeStr(view->shape)));
      }
      if (!seen.insert(name).second) {
        return Bad(path, absl::StrCat("tensor '", name, "' appears in more than one file"));
      }
      absl::Status s = f.ReadF32(name, params + view->offset, view->numel);
      f.Release(name);
      RETURN_IF_ERROR(s);
      // A NaN or Inf weight poisons every step that reads it: refuse at load.
      const float* w = params + view->offset;
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < view->numel; ++i) {
        if (!std::isfinite(w[i]) && bad++ == 0) first = i;
      }
      if (bad > 0) {
        return Bad(path, absl::StrCat("tensor '", name, "' has ", bad, " non-finite values (NaN or Inf; first at ",
                                      first, "): the weights are damaged"));
      }
    }
  }
  std::vector<std::string> missing;
  for (const TensorView& t : layout.tensors()) {
    if (!seen.count(t.name)) missing.push_back(t.name);
  }
  if (!missing.empty()) {
    if (missing.size() > 5) {
      const size_t more = missing.size() - 5;
      missing.resize(5);
      missing.push_back(absl::StrCat("... ", more, " more"));
    }
    return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tensor(s) ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir) {
  const std::string cfg_path = (std::filesystem::path(dir) / "config.json").string();
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(cfg_path));
  auto config = ParseConfigJson(text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(cfg_path, ": ", config.status().message()));
  }
  LoadedModel m;
  m.config = *std::move(config);
  m.params.assign(ParamLayout(m.config).total_floats(), 0.f);
  RETURN_IF_ERROR(LoadWeights(dir, m.config, m.params.data()));
  if (m.config.tokenizer == "char" || std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    auto tok = CharTokenizer::Load(dir);
    if (tok.ok()) {
      m.tokenizer = *tok;
    } else if (m.config.tokenizer == "char") {
      return tok.status();
    }  // else: a foreign tokenizer.json (e.g. a HF BPE one): ids only
  }
  return m;
}

namespace {

// Removes dir/name if it exists; a failure other than "not there" is an
// error (a stale weight file left behind could be loaded instead).
absl::Status RemoveIfPresent(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", path.string(), ": ", ec.message()));
  return absl::OkStatus();
}

bool IsShardName(const std::string& name) {
  // model-DDDDD-of-DDDDD.safetensors
  if (name.size() != 32 || !name.starts_with("model-") || name.substr(11, 4) != "-of-" ||
      !name.ends_with(".safetensors")) {
    return false;
  }
  for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19}) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

// Weight files in `dir` from an earlier save that `keep` does not name.
absl::Status RemoveStaleShards(const std::filesystem::path& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (IsShardName(name) && !keep.count(name)) stale.push_back(e.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  for (const auto& p : stale) {
    RETURN_IF_ERROR(RemoveIfPresent(p));
  }
  return absl::OkStatus();
}

json TokenIdJson(const std::vector<int>& ids) { return ids.size() == 1 ? json(ids[0]) : json(ids); }

// generation_config.json: the source's when it has one, with the config's
// special ids added where missing.
absl::StatusOr<std::string> GenerationConfigJson(const ModelConfig& c, const std::string& source_dir) {
  json g = json::object();
  bool from_source = false;
  if (!source_dir.empty()) {
    const std::string path = (std::filesystem::path(source_dir) / "generation_config.json").string();
    auto text = ReadFileToString(path);
    if (text.ok()) {
      auto parsed = ParseStrictJson(*text, "generation_config.json");
      if (!parsed.ok() || !parsed->is_object()) {
        return Bad(path, parsed.ok() ? "not a JSON object" : parsed.status().message());
      }
      g = std::move(*parsed);
      from_source = true;
    } else if (text.status().code() != absl::StatusCode::kNotFound) {
      return text.status();
    }
  }
  if (!from_source) g["_from_model_config"] = true;
  if (!g.contains("bos_token_id") && c.bos_token_id >= 0) g["bos_token_id"] = c.bos_token_id;
  if (!g.contains("eos_token_id") && !c.eos_token_ids.empty()) {
    g["eos_token_id"] = TokenIdJson(c.eos_token_ids);
  }
  if (!g.contains("pad_token_id") && c.pad_token_id >= 0) g["pad_token_id"] = c.pad_token_id;
  return g.dump(2) + "\n";
}

}  // namespace

absl::Status SaveModelDir(const std::string& dir, const ModelConfig& config, const float* params,
                          const CharTokenizer* tokenizer, const SaveOptions& options) {
  namespace fs = std::filesystem;
  if (options.dtype != StDtype::kF32 && options.dtype != StDtype::kBF16) {
    return absl::InvalidArgumentError("SaveModelDir: only F32 and BF16 are written");
  }
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("SaveModelDir: max_shard_bytes must be positive");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const fs::path d(dir);
  const ParamLayout layout(config);
  const size_t esize = StDtypeSize(options.dtype);

  // Shards as HF's save_pretrained forms them.
  std::vector<std::vector<StTensorToWrite>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorView& t : layout.tensors()) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel) * esize;
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({t.name, t.shape, params + t.offset});
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const fs::path single = d / "model.safetensors";
  const fs::path index = d / "model.safetensors.index.json";
  absl::Status s;
  if (shards.size() == 1) {
    // The index goes first: a crash leaves no weights rather than old ones.
    s = RemoveIfPresent(index);
    if (s.ok()) s = WriteSafetensors(single.string(), shards[0], metadata, options.dtype);
    if (s.ok()) s = RemoveStaleShards(d, {});
  } else {
    // model.safetensors would win over the index: it goes first.
    s = RemoveIfPresent(single);
    const size_t n = shards.size();
    json weight_map = json::object();
    std::set<std::string> names;
    for (size_t i = 0; s.ok() && i < n; ++i) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, n);
      names.insert(name);
      for (const StTensorToWrite& t : shards[i]) weight_map[t.name] = name;
      s = WriteSafetensors((d / name).string(), shards[i], metadata, options.dtype);
    }
    if (s.ok()) {
      json j;
      j["metadata"] = {{"total_size", total_bytes}};
      j["weight_map"] = weight_map;
      s = WriteFileAtomic(index.string(), j.dump(2) + "\n");
    }
    if (s.ok()) s = RemoveStaleShards(d, names);
  }
  RETURN_IF_ERROR(s);

  ModelConfig c = config;
  c.torch_dtype = options.dtype == StDtype::kBF16 ? "bfloat16" : "float32";
  RETURN_IF_ERROR(WriteFileAtomic((d / "config.json").string(), ToConfigJson(c)));
  ASSIGN_OR_RETURN(const std::string generation, GenerationConfigJson(c, options.source_dir));
  RETURN_IF_ERROR(WriteFileAtomic((d / "generation_config.json").string(), generation));

  bool copied_tokenizer = false;
  if (!options.source_dir.empty()) {
    for (const char* f : kTokenizerFiles) {
      auto text = ReadFileToString((fs::path(options.source_dir) / f).string());
      if (!text.ok()) {
        if (text.status().code() == absl::StatusCode::kNotFound) continue;
        return text.status();
      }
      RETURN_IF_ERROR(WriteFileAtomic((d / f).string(), *text));
      copied_tokenizer |= std::string_view(f) == "tokenizer.json";
    }
  }
  if (!copied_tokenizer && tokenizer != nullptr) return tokenizer->Save(dir);
  return absl::OkStatus();
}

}  // namespace tandem::model
