// Safetensors files (https://github.com/huggingface/safetensors): reading
// (mmap, everything validated, F32/BF16/F16/F64 converted to f32 tensor by
// tensor) and atomic, streamed writing (F32, or BF16 on request). Plus the
// Hugging Face model directory: config.json + model.safetensors (or
// model-XXXXX-of-YYYYY.safetensors with model.safetensors.index.json) +
// generation_config.json + the tokenizer files (implemented in
// hf_model_dir.cc).
//
// A bad file gives an InvalidArgument (NotFound for a missing file) whose
// message names the file and the problem; nothing crashes. SafetensorsFile
// is move-only and unmaps on destruction; safe to read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/model/tokenizer.h"

namespace tandem::model {

enum class StDtype { kF32, kF16, kBF16, kF64 };
const char* StDtypeName(StDtype d);
size_t StDtypeSize(StDtype d);

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets relative to the data section
  size_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Converts tensor `name` to f32 into out[numel].
  absl::Status ReadF32(const std::string& name, float* out, size_t numel) const;
  // Drops the mapped pages of tensor `name` from this process's memory (a
  // later read maps them again from the file): keeps a whole-model load at
  // one tensor of file data at a time.
  void Release(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_start_ = 0;
  std::map<std::string, StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Parses and validates a header (the JSON) against a data section of
// `data_size` bytes. Exposed for tests.
absl::Status ParseSafetensorsHeader(std::string_view json, size_t data_size,
                                    std::map<std::string, StTensorInfo>* tensors,
                                    std::map<std::string, std::string>* metadata);

struct StTensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel floats
};

// Writes tensors (in the order given) atomically, streamed: BF16 is
// converted (round to nearest even) in chunks, never the whole file at once.
// dtype kF32 or kBF16.
absl::Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata, StDtype dtype = StDtype::kF32);

// Conversions (exposed for tests).
float Bf16ToF32(uint16_t v);
uint16_t F32ToBf16(float f);
float F16ToF32(uint16_t v);

struct LoadedModel {
  ModelConfig config;
  std::vector<float> params;  // ParamLayout(config).total_floats()
  std::optional<CharTokenizer> tokenizer;
};

// Loads DIR/config.json and the weights into the flat layout. Missing
// tensor, extra tensor (other than rotary_emb.inv_freq buffers, and
// lm_head.weight when tied), or a shape not matching config.json are errors.
absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir);
// Loads only the weights of `dir` into params (sized for `config`).
absl::Status LoadWeights(const std::string& dir, const ModelConfig& config, float* params);

// Hugging Face's default max_shard_size ("5GB", decimal).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

struct SaveOptions {
  StDtype dtype = StDtype::kF32;  // kF32 or kBF16
  // Weights larger than this (bytes, in `dtype`) are split as HF's
  // save_pretrained does: tensors in layout order, a new shard when the
  // next tensor would pass the limit (a tensor larger than the limit alone
  // in its shard), model-0000i-of-0000N.safetensors +
  // model.safetensors.index.json {"metadata": {"total_size"}, "weight_map"}.
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  // The HF model directory the model was loaded from (empty: none). Its
  // tokenizer files (kTokenizerFiles) are copied through, and its
  // generation_config.json is kept, with the config's bos/eos/pad ids added
  // where it lacks them.
  std::string source_dir;
};

// Tokenizer files copied from SaveOptions::source_dir when present.
inline constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt",     "added_tokens.json",     "chat_template.jinja"};

// Writes DIR (created if needed) as an HF model directory: the weights
// (single file or shards, as above; weight files of an earlier save that do
// not belong to this one are removed, so a loader never picks stale
// weights), config.json (torch_dtype from `dtype`), generation_config.json
// (bos/eos/pad ids; eos an int or a list), and the tokenizer: the source
// directory's files, else the char tokenizer's tokenizer.json when
// `tokenizer` != nullptr. Each file is written atomically.
absl::Status SaveModelDir(const std::string& dir, const ModelConfig& config, const float* params,
                          const CharTokenizer* tokenizer, const SaveOptions& options = {});

}  // namespace tandem::model
