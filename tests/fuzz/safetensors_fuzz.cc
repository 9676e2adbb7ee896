// Fuzz target: a safetensors file (worker/model/safetensors.h), as
// `tandemctl` and the workers read model.safetensors from a model
// directory. The input is the whole file: 8-byte header length, JSON
// header, data. Every tensor the header declares is converted to f32, then
// the directory is loaded as the weights of a fixed tiny model (names,
// shapes, dtypes against config.json). Any error Status is fine; a crash,
// a sanitizer report or a leak is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fixtures.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"
#include "worker/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = tandem::fuzz::ScratchDir("safetensors");
  static const tandem::model::ModelConfig config = tandem::fuzz::TinyModelConfig();
  static const size_t total_floats = tandem::model::ParamLayout(config).total_floats();
  const std::string path = dir + "/model.safetensors";
  tandem::fuzz::WriteFileOrDie(path, data, size);

  auto file = tandem::model::SafetensorsFile::Open(path);
  if (file.ok()) {
    std::vector<float> out;
    for (const auto& [name, info] : file->tensors()) {
      // The header's offsets are checked against the file size, so numel is
      // bounded by the input's length. One spare float: never a null buffer.
      out.resize(info.numel() + 1);
      (void)file->ReadF32(name, out.data(), info.numel());
    }
  }
  std::vector<float> params(total_floats);
  (void)tandem::model::LoadWeights(dir, config, params.data());
  return 0;
}
