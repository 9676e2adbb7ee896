#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmath>

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

std::string ShapeStr(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }
}  // namespace

const char* StDtypeName(StDtype d) {
  switch (d) {
    case StDtype::kF32:
      return "F32";
    case StDtype::kF16:
      return "F16";
    case StDtype::kBF16:
      return "BF16";
    case StDtype::kF64:
      return "F64";
  }
  return "?";
}

size_t StDtypeSize(StDtype d) {
  switch (d) {
    case StDtype::kF32:
      return 4;
    case StDtype::kF16:
      return 2;
    case StDtype::kBF16:
      return 2;
    case StDtype::kF64:
      return 8;
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
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
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
          return absl::InvalidArgumentError(absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
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
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
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
      static const std::set<std::string> kKnown = {"BOOL", "U8",      "I8",      "U16",     "I16",     "U32",
                                                   "I32",  "U64",     "I64",     "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                                   "F4",   "F6_E2M3", "F6_E3M2", "C64"};
      return bad(kKnown.count(dt) ? absl::StrCat("dtype ", dt, " is not supported (F32, F16, BF16, F64)")
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
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] out of range: the data section has ",
                              data_size, " bytes"));
    }
    const unsigned __int128 want = numel * StDtypeSize(t.dtype);
    if (want != t.end - t.begin) {
      return bad(absl::StrCat("data_offsets span ", t.end - t.begin, " bytes but shape ", ShapeStr(t.shape), " of ", dt,
                              " needs ", static_cast<uint64_t>(want)));
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
          "tensors '", by_offset[i - 1]->name, "' [", by_offset[i - 1]->begin, ", ", by_offset[i - 1]->end, ") and '",
          by_offset[i]->name, "' [", by_offset[i]->begin, ", ", by_offset[i]->end, ") overlap"));
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
    return Bad(path, absl::StrCat("file is ", size, " bytes, shorter than the 8-byte header length (truncated?)"));
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
    return Bad(path,
               absl::StrCat("header length ", n, " runs past the end of the file (", size, " bytes; truncated?)"));
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

absl::Status SafetensorsFile::ReadF32(const std::string& name, float* out, size_t numel) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return Bad(path_, absl::StrCat("no tensor '", name, "'"));
  const StTensorInfo& t = it->second;
  if (t.numel() != numel) {
    return Bad(path_, absl::StrCat("tensor '", name, "' has ", t.numel(), " elements, expected ", numel));
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

absl::Status WriteSafetensors(const std::string& path, const std::vector<StTensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata, StDtype dtype) {
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

}  // namespace tandem::model
