#include "worker/model/safetensors.h"

#include <cmath>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "worker/model/strict_json.h"

namespace tandem::model {

namespace {
using nlohmann::json;
constexpr size_t kMaxHeader = 100u << 20;  // as the reference implementation

absl::Status Bad(const std::string& path, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}
}  // namespace

const char* StDtypeName(StDtype d) {
  switch (d) {
    case StDtype::kF32: return "F32";
    case StDtype::kF16: return "F16";
    case StDtype::kBF16: return "BF16";
    case StDtype::kF64: return "F64";
  }
  return "?";
}

size_t StDtypeSize(StDtype d) {
  switch (d) {
    case StDtype::kF32: return 4;
    case StDtype::kF16: return 2;
    case StDtype::kBF16: return 2;
    case StDtype::kF64: return 8;
  }
  return 0;
}

size_t StTensorInfo::numel() const {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  return n;
}

float Bf16ToF32(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN stays NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

absl::Status ParseSafetensorsHeader(std::string_view text, size_t data_size,
                                    std::map<std::string, StTensorInfo>* tensors,
                                    std::map<std::string, std::string>* metadata) {
  ASSIGN_OR_RETURN(const json j, ParseStrictJson(text, "header"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError("header JSON is not an object");
  }
  std::vector<const StTensorInfo*> by_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError("__metadata__ must be an object of strings");
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "__metadata__ value of '", m.key(), "' is not a string"));
        }
        (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", why));
    };
    if (!v.is_object()) return bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("missing dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) return bad("missing shape");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2) {
      return bad("data_offsets must be [begin, end]");
    }
    StTensorInfo t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    if (dt == "F32") t.dtype = StDtype::kF32;
    else if (dt == "F16") t.dtype = StDtype::kF16;
    else if (dt == "BF16") t.dtype = StDtype::kBF16;
    else if (dt == "F64") t.dtype = StDtype::kF64;
    else {
      static const std::set<std::string> kKnown = {
          "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64",
          "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};
      return bad(kKnown.count(dt)
                     ? absl::StrCat("dtype ", dt, " is not supported (F32, F16, BF16, F64)")
                     : absl::StrCat("unknown dtype '", dt, "'"));
    }
    unsigned __int128 numel = 1;
    for (const json& s : v["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) {
        return bad(absl::StrCat("shape ", v["shape"].dump(), " is not a list of non-negative integers"));
      }
      t.shape.push_back(s.get<int64_t>());
      numel *= static_cast<uint64_t>(s.get<int64_t>());
      if (numel > (unsigned __int128)(1) << 62) return bad("shape is absurdly large");
    }
    for (const json& o : v["data_offsets"]) {
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0)) {
        return bad(absl::StrCat("data_offsets ", v["data_offsets"].dump(), " are not non-negative integers"));
      }
    }
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] have begin > end"));
    }
    if (t.end > data_size) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                              "] out of range: the data section has ", data_size, " bytes"));
    }
    const unsigned __int128 want = numel * StDtypeSize(t.dtype);
    if (want != t.end - t.begin) {
      return bad(absl::StrCat("data_offsets span ", t.end - t.begin, " bytes but shape ",
                              ShapeStr(t.shape), " of ", dt, " needs ",
                              static_cast<uint64_t>(want)));
    }
    auto [pos, inserted] = tensors->emplace(name, std::move(t));
    if (!inserted) return bad("appears twice");
  }
  for (const auto& [name, t] : *tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const StTensorInfo* a, const StTensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors '", by_offset[i - 1]->name, "' [", by_offset[i - 1]->begin, ", ",
          by_offset[i - 1]->end, ") and '", by_offset[i]->name, "' [",
          by_offset[i]->begin, ", ", by_offset[i]->end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Bad(path, absl::StrCat("file is ", size,
                                  " bytes, shorter than the 8-byte header length (truncated?)"));
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(errno)));
  }
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = static_cast<const uint8_t*>(m);
  f.map_size_ = size;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f.map_[i]) << (8 * i);
  if (n > size - 8) {
    return Bad(path, absl::StrCat("header length ", n, " runs past the end of the file (",
                                  size, " bytes; truncated?)"));
  }
  if (n > kMaxHeader) return Bad(path, absl::StrCat("header length ", n, " exceeds 100 MB"));
  f.data_start_ = 8 + n;
  std::string_view header(reinterpret_cast<const char*>(f.map_ + 8), n);
  absl::Status s = ParseSafetensorsHeader(header, size - f.data_start_, &f.tensors_, &f.metadata_);
  if (!s.ok()) return Bad(path, s.message());
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), map_size_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

absl::Status SafetensorsFile::ReadF32(const std::string& name, float* out,
                                      size_t numel) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Bad(path_, absl::StrCat("no tensor '", name, "'"));
  const StTensorInfo& t = it->second;
  if (t.numel() != numel) {
    return Bad(path_, absl::StrCat("tensor '", name, "' has ", t.numel(),
                                   " elements, expected ", numel));
  }
  const uint8_t* src = map_ + data_start_ + t.begin;
  switch (t.dtype) {
    case StDtype::kF32:
      std::memcpy(out, src, numel * 4);
      break;
    case StDtype::kF64:
      for (size_t i = 0; i < numel; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case StDtype::kBF16:
    case StDtype::kF16:
      for (size_t i = 0; i < numel; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = t.dtype == StDtype::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
      }
      break;
  }
  return absl::OkStatus();
}

void SafetensorsFile::Release(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || map_ == nullptr) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = (data_start_ + it->second.begin) / page * page;
  const size_t end = std::min(map_size_, (data_start_ + it->second.end + page - 1) / page * page);
  if (end > begin) {
    // Advice only: on failure the pages simply stay until the unmap.
    (void)::madvise(const_cast<uint8_t*>(map_) + begin, end - begin, MADV_DONTNEED);
  }
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<StTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata,
                              StDtype dtype) {
  if (dtype != StDtype::kF32 && dtype != StDtype::kBF16) {
    return absl::InvalidArgumentError("WriteSafetensors: only F32 and BF16 are written");
  }
  const size_t esize = StDtypeSize(dtype);
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  size_t off = 0;
  std::vector<size_t> sizes;
  for (const StTensorToWrite& t : tensors) {
    size_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<size_t>(s);
    json e;
    e["dtype"] = StDtypeName(dtype);
    e["shape"] = t.shape;
    e["data_offsets"] = {off, off + numel * esize};
    header[t.name] = e;
    off += numel * esize;
    sizes.push_back(numel);
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  return WriteFileAtomicStream(path, [&](const AtomicWriteFn& write) -> absl::Status {
    absl::Status st = write(len);
    if (st.ok()) st = write(h);
    // BF16: converted through a fixed buffer (4 MiB), tensor by tensor.
    std::vector<uint16_t> converted(dtype == StDtype::kBF16 ? (size_t{1} << 21) : 0);
    for (size_t i = 0; st.ok() && i < tensors.size(); ++i) {
      const float* src = tensors[i].data;
      if (dtype == StDtype::kF32) {
        st = write(std::string_view(reinterpret_cast<const char*>(src), sizes[i] * 4));
        continue;
      }
      for (size_t done = 0; st.ok() && done < sizes[i];) {
        const size_t n = std::min(converted.size(), sizes[i] - done);
        for (size_t k = 0; k < n; ++k) converted[k] = F32ToBf16(src[done + k]);
        st = write(std::string_view(reinterpret_cast<const char*>(converted.data()), n * 2));
        done += n;
      }
    }
    return st;
  });
}

absl::Status LoadWeights(const std::string& dir, const ModelConfig& config,
                         float* params) {
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
    if (!j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
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
    return absl::NotFoundError(absl::StrCat(
        "no model.safetensors or model.safetensors.index.json in ", dir));
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
        return Bad(path, absl::StrCat("unexpected tensor '", name,
                                      "': not part of the model described by config.json (",
                                      config.model_type, ", ", config.num_hidden_layers,
                                      " layers, tie_word_embeddings=",
                                      config.tie_word_embeddings ? "true" : "false",
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
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": missing tensor(s) ", absl::StrJoin(missing, ", ")));
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
  if (m.config.tokenizer == "char" ||
      std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
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
absl::Status RemoveStaleShards(const std::filesystem::path& dir,
                               const std::set<std::string>& keep) {
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

json TokenIdJson(const std::vector<int>& ids) {
  return ids.size() == 1 ? json(ids[0]) : json(ids);
}

// generation_config.json: the source's when it has one, with the config's
// special ids added where missing.
absl::StatusOr<std::string> GenerationConfigJson(const ModelConfig& c,
                                                 const std::string& source_dir) {
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

absl::Status SaveModelDir(const std::string& dir, const ModelConfig& config,
                          const float* params, const CharTokenizer* tokenizer,
                          const SaveOptions& options) {
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
