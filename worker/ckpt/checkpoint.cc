#include "worker/ckpt/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "common/base/status_macros.h"
#include "common/checkpoint_path.h"
#include "nlohmann/json.hpp"
#include "worker/model/file_util.h"
#include "worker/model/strict_json.h"

namespace tandem::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'S', 'H', 'R', 'D'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxHeader = 64u << 20;
// Manifest versions: 1 has no checksum of its own (still read), 2 carries
// "checksum": the xxh64 of the manifest's JSON without that field.
constexpr int kManifestVersion = 2;
constexpr int kMaxWorldSize = 1 << 16;

// a + b, or an error when it does not fit in 64 bits.
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* sum) { return __builtin_add_overflow(a, b, sum); }

absl::Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return absl::InternalError("open " + path + ": " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError("fsync " + path + ": " + std::strerror(errno));
  return absl::OkStatus();
}

std::string ToHex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

absl::StatusOr<uint64_t> FromHex(const std::string& s) {
  if (s.size() != 16) return absl::DataLossError("bad checksum field '" + s + "'");
  uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return absl::DataLossError("bad checksum field '" + s + "'");
    v = v * 16 + static_cast<uint64_t>(d);
  }
  return v;
}

// Integer fields of a manifest into *out: nlohmann's get<int>() would
// convert a float such as 1e300 with undefined behaviour and cut a big
// integer silently, so only integers that fit T are taken. A missing key
// leaves *out as it is when `optional`, else is an error.
template <typename T>
absl::Status ReadInteger(const json& object, const char* key, T* out, const std::string& where, bool optional = false) {
  const auto it = object.is_object() ? object.find(key) : object.end();
  if (it == object.end()) {
    return optional ? absl::OkStatus() : absl::DataLossError(where + ": '" + key + "' is missing");
  }
  if (it->is_number_unsigned() && std::in_range<T>(it->get<uint64_t>())) {
    *out = static_cast<T>(it->get<uint64_t>());
    return absl::OkStatus();
  }
  if (it->is_number_integer() && !it->is_number_unsigned() && std::in_range<T>(it->get<int64_t>())) {
    *out = static_cast<T>(it->get<int64_t>());
    return absl::OkStatus();
  }
  return absl::DataLossError(where + ": '" + key + "' must be an integer in [" +
                             std::to_string(std::numeric_limits<T>::min()) + ", " +
                             std::to_string(std::numeric_limits<T>::max()) + "], got " + it->dump());
}

absl::Status ShardSizeMismatch(const std::string& path, uint64_t actual, uint64_t claimed) {
  return absl::DataLossError("checkpoint shard " + path + " has " + std::to_string(actual) + " bytes, manifest says " +
                             std::to_string(claimed) + " (truncated?)");
}

std::string ManifestChecksum(json j) {
  j.erase("checksum");
  const std::string text = j.dump();
  return ToHex(XXH64(text.data(), text.size(), 0));
}
}  // namespace

uint64_t ShardState::num_floats() const {
  uint64_t n = 0;
  for (const Range& r : ranges) n += r.count;  // bounded: ReadShard checks the sum
  return n;
}

uint64_t Xxh64(const void* data, size_t bytes) { return XXH64(data, bytes, 0); }

std::string StepDirName(int64_t step) { return common::CheckpointStepDirName(step); }

std::string ShardFileName(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.bin", rank, world_size);
  return buf;
}

std::string PartialDir(const std::string& root, int64_t step) { return root + "/" + StepDirName(step) + ".partial"; }
std::string FinalDir(const std::string& root, int64_t step) { return root + "/" + StepDirName(step); }

absl::StatusOr<ShardFileInfo> WriteShard(const std::string& dir, int world_size, const ShardState& state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError("create " + dir + ": " + ec.message());
  const uint64_t n = state.num_floats();
  json header;
  header["ranges"] = json::array();
  for (const Range& r : state.ranges) header["ranges"].push_back({r.offset, r.count});
  header["arrays"] = json::array();
  for (const auto& [name, values] : state.arrays) {
    if (values.size() != n) {
      return absl::InvalidArgumentError("shard array " + name + " has " + std::to_string(values.size()) +
                                        " floats, ranges cover " + std::to_string(n));
    }
    header["arrays"].push_back(name);
  }
  header["rank"] = state.rank;
  const std::string h = header.dump();
  std::string prefix(kMagic, sizeof kMagic);
  const uint32_t version = kVersion, hlen = static_cast<uint32_t>(h.size());
  prefix.append(reinterpret_cast<const char*>(&version), 4);
  prefix.append(reinterpret_cast<const char*>(&hlen), 4);
  prefix += h;
  std::vector<std::string_view> parts = {prefix};
  XXH64_state_t* xs = XXH64_createState();
  XXH64_reset(xs, 0);
  XXH64_update(xs, prefix.data(), prefix.size());
  uint64_t bytes = prefix.size();
  for (const auto& [name, values] : state.arrays) {
    std::string_view sv(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    parts.push_back(sv);
    XXH64_update(xs, sv.data(), sv.size());
    bytes += sv.size();
  }
  const uint64_t sum = XXH64_digest(xs);
  XXH64_freeState(xs);
  const std::string file = ShardFileName(state.rank, world_size);
  RETURN_IF_ERROR(model::WriteFileAtomicParts(dir + "/" + file, parts));
  return ShardFileInfo{file, state.rank, bytes, sum};
}

absl::StatusOr<ShardState> ReadShard(const std::string& dir, const ShardFileInfo& info) {
  const std::string path = dir + "/" + info.file;
  auto data = model::ReadFileToString(path);
  if (!data.ok()) {
    return absl::NotFoundError("checkpoint shard " + path + " is missing: " + std::string(data.status().message()));
  }
  if (data->size() != info.bytes) return ShardSizeMismatch(path, data->size(), info.bytes);
  if (Xxh64(data->data(), data->size()) != info.xxh64) {
    return absl::DataLossError("checkpoint shard " + path + " fails its xxh64 checksum");
  }
  if (data->size() < 16 || std::memcmp(data->data(), kMagic, 8) != 0) {
    return absl::DataLossError(path + ": not a Tandem shard file (bad magic)");
  }
  uint32_t version, hlen;
  std::memcpy(&version, data->data() + 8, 4);
  std::memcpy(&hlen, data->data() + 12, 4);
  if (version != kVersion) {
    return absl::DataLossError(path + ": unsupported shard version " + std::to_string(version));
  }
  if (hlen > kMaxHeader || 16 + static_cast<uint64_t>(hlen) > data->size()) {
    return absl::DataLossError(path + ": header length past the end of the file");
  }
  auto parsed = model::ParseStrictJson(std::string_view(data->data() + 16, hlen), "shard header");
  if (!parsed.ok()) return absl::DataLossError(path + ": " + std::string(parsed.status().message()));
  json header = std::move(*parsed);
  if (!header.is_object() || !header.contains("ranges") || !header.contains("arrays") || !header["ranges"].is_array() ||
      !header["arrays"].is_array()) {
    return absl::DataLossError(path + ": invalid shard header");
  }
  ShardState st;
  const json& rank = header.contains("rank") ? header["rank"] : json(info.rank);
  if (!rank.is_number_integer() || rank.get<int64_t>() != info.rank) {
    return absl::DataLossError(path + ": shard header rank does not match the manifest's");
  }
  st.rank = info.rank;
  // Every count is bounded by what the file holds: no sum or product below
  // can wrap.
  const uint64_t max_floats = data->size() / 4;
  uint64_t n = 0;
  for (const auto& r : header["ranges"]) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() || !r[1].is_number_unsigned()) {
      return absl::DataLossError(path + ": invalid range in shard header");
    }
    const Range range{r[0].get<uint64_t>(), r[1].get<uint64_t>()};
    uint64_t end = 0;
    if (AddOverflows(range.offset, range.count, &end) || AddOverflows(n, range.count, &n) || n > max_floats) {
      return absl::DataLossError(path + ": shard ranges cover more floats than the file holds");
    }
    st.ranges.push_back(range);
  }
  const size_t arrays = header["arrays"].size();
  if (arrays > 0 && n > max_floats / arrays) {
    return absl::DataLossError(path + ": shard arrays need more bytes than the file holds");
  }
  uint64_t pos = 16 + hlen;
  for (const auto& name : header["arrays"]) {
    if (!name.is_string()) return absl::DataLossError(path + ": invalid array name");
    for (const auto& [seen, values] : st.arrays) {
      if (seen == name.get<std::string>()) return absl::DataLossError(path + ": array " + seen + " appears twice");
    }
    if (n * 4 > data->size() - pos) {
      return absl::DataLossError(path + ": array " + name.get<std::string>() + " runs past the end of the file");
    }
    std::vector<float> values(n);
    if (n > 0) std::memcpy(values.data(), data->data() + pos, n * 4);  // empty: data() may be null
    pos += n * 4;
    st.arrays.emplace_back(name.get<std::string>(), std::move(values));
  }
  if (pos != data->size()) return absl::DataLossError(path + ": trailing bytes after arrays");
  return st;
}

std::string ShardAnnouncement(const ShardFileInfo& info) {
  return json{{"file", info.file}, {"rank", info.rank}, {"bytes", info.bytes}, {"xxh64", info.xxh64}}.dump();
}

absl::StatusOr<ShardFileInfo> ParseShardAnnouncement(const std::string& text, int rank, int world) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError("checkpoint: rank " + std::to_string(rank) + "'s shard announcement " + why);
  };
  auto j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad("is not a JSON object");
  const auto file = j.find("file");
  const auto r = j.find("rank");
  const auto bytes = j.find("bytes");
  const auto sum = j.find("xxh64");
  if (file == j.end() || !file->is_string() || r == j.end() || !r->is_number_integer() || bytes == j.end() ||
      !bytes->is_number_unsigned() || sum == j.end() || !sum->is_number_unsigned()) {
    return bad("lacks file/rank/bytes/xxh64 of the right types");
  }
  if (r->get<int64_t>() != rank || file->get<std::string>() != ShardFileName(rank, world)) {
    return bad("names another rank or file");
  }
  return ShardFileInfo{file->get<std::string>(), rank, bytes->get<uint64_t>(), sum->get<uint64_t>()};
}

absl::Status WriteManifest(const std::string& dir, const Manifest& m) {
  json j;
  j["format"] = "tandem-checkpoint";
  j["version"] = kManifestVersion;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["zero_stage"] = m.zero_stage;
  j["generation"] = m.generation;
  j["policy_version"] = m.policy_version;
  j["optimizer_steps"] = m.optimizer_steps;
  j["total_floats"] = m.total_floats;
  j["config_hash"] = m.config_hash;
  j["rng_state"] = m.rng_state;
  j["data_cursor"] = m.data_cursor;
  if (!m.trainable.empty()) j["trainable"] = m.trainable;
  j["extra"] = m.extra;
  j["shards"] = json::array();
  for (const auto& s : m.shards) {
    j["shards"].push_back({{"file", s.file}, {"rank", s.rank}, {"bytes", s.bytes}, {"xxh64", ToHex(s.xxh64)}});
  }
  j["checksum"] = ManifestChecksum(j);
  return model::WriteFileAtomic(dir + "/manifest.json", j.dump(2));
}

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  auto text = model::ReadFileToString(dir + "/manifest.json");
  if (!text.ok()) return absl::NotFoundError(dir + "/manifest.json is missing");
  auto parsed = model::ParseStrictJson(*text, "manifest.json");
  if (!parsed.ok() && absl::StrContains(parsed.status().message(), "appears twice")) {
    return absl::DataLossError(dir + "/" + std::string(parsed.status().message()));
  }
  json j = parsed.ok() ? std::move(*parsed) : json();
  const auto format = j.is_object() ? j.find("format") : j.end();
  if (!j.is_object() || format == j.end() || !format->is_string() ||
      format->get<std::string>() != "tandem-checkpoint") {
    return absl::DataLossError(dir + "/manifest.json is not a Tandem checkpoint manifest");
  }
  Manifest m;
  const std::string where = dir + "/manifest.json";
  try {
    int version = 0;
    RETURN_IF_ERROR(ReadInteger(j, "version", &version, where));
    if (version < 1 || version > kManifestVersion) {
      return absl::DataLossError(dir + "/manifest.json: unsupported version " + std::to_string(version));
    }
    if (version >= 2 && (!j.contains("checksum") || !j["checksum"].is_string() ||
                         j["checksum"].get<std::string>() != ManifestChecksum(j))) {
      return absl::DataLossError(dir + "/manifest.json fails its checksum (damaged or edited)");
    }
    for (const absl::Status& st :
         {ReadInteger(j, "step", &m.step, where), ReadInteger(j, "world_size", &m.world_size, where),
          ReadInteger(j, "zero_stage", &m.zero_stage, where),
          ReadInteger(j, "generation", &m.generation, where, /*optional=*/true),
          ReadInteger(j, "policy_version", &m.policy_version, where, true),
          ReadInteger(j, "optimizer_steps", &m.optimizer_steps, where, true),
          ReadInteger(j, "total_floats", &m.total_floats, where)}) {
      RETURN_IF_ERROR(st);
    }
    m.config_hash = j.value("config_hash", "");
    m.rng_state = j.value("rng_state", "");
    m.data_cursor = j.value("data_cursor", "");
    if (j.contains("trainable") && !j["trainable"].is_string()) {
      return absl::DataLossError(where + ": trainable is not a string");
    }
    m.trainable = j.value("trainable", "");
    if (j.contains("extra")) m.extra = j["extra"].get<std::map<std::string, double>>();
    std::set<std::string> files;
    for (const auto& s : j.at("shards")) {
      ShardFileInfo info;
      info.file = s.at("file").get<std::string>();
      for (const absl::Status& st : {ReadInteger(s, "rank", &info.rank, where + ": shard"),
                                     ReadInteger(s, "bytes", &info.bytes, where + ": shard")}) {
        RETURN_IF_ERROR(st);
      }
      ASSIGN_OR_RETURN(info.xxh64, FromHex(s.at("xxh64").get<std::string>()));
      if (info.file.find('/') != std::string::npos || info.file.find("..") != std::string::npos) {
        return absl::DataLossError(dir + "/manifest.json: shard file name '" + info.file +
                                   "' leaves the checkpoint directory");
      }
      if (!files.insert(info.file).second) {
        return absl::DataLossError(dir + "/manifest.json lists shard file " + info.file + " twice");
      }
      m.shards.push_back(info);
    }
  } catch (const json::exception& e) {
    return absl::DataLossError(dir + "/manifest.json: " + e.what());
  }
  if (m.world_size < 1 || m.world_size > kMaxWorldSize || static_cast<int>(m.shards.size()) != m.world_size) {
    return absl::DataLossError(dir + "/manifest.json lists " + std::to_string(m.shards.size()) +
                               " shards for world size " + std::to_string(m.world_size));
  }
  if (m.step < 0) return absl::DataLossError(dir + "/manifest.json: negative step");
  // Every element lives in some shard as at least one float: total_floats
  // cannot exceed what the shards hold (checked before anything is sized by it).
  uint64_t shard_bytes = 0;
  for (const auto& s : m.shards) {
    if (AddOverflows(shard_bytes, s.bytes, &shard_bytes)) {
      return absl::DataLossError(dir + "/manifest.json: shard sizes overflow");
    }
  }
  if (m.total_floats > shard_bytes / 4) {
    return absl::DataLossError(dir + "/manifest.json: total_floats " + std::to_string(m.total_floats) +
                               " is more than its shards hold");
  }
  return m;
}

absl::StatusOr<uint64_t> CheckpointBytes(const std::string& dir, const Manifest& manifest) {
  std::error_code ec;
  uint64_t bytes = fs::file_size(dir + "/manifest.json", ec);
  if (ec) return absl::NotFoundError(dir + "/manifest.json: " + ec.message());
  for (const auto& s : manifest.shards) bytes += s.bytes;
  return bytes;
}

absl::Status Publish(const std::string& root, int64_t step) {
  const std::string from = PartialDir(root, step), to = FinalDir(root, step);
  RETURN_IF_ERROR(FsyncPath(from));
  std::error_code ec;
  if (fs::exists(to, ec)) fs::remove_all(to, ec);  // a redone step replaces its old copy
  fs::rename(from, to, ec);
  if (ec) return absl::InternalError("rename " + from + " -> " + to + ": " + ec.message());
  return FsyncPath(root);
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir) {
  ASSIGN_OR_RETURN(auto m, ReadManifest(dir));
  // ReadManifest bounds total_floats by the shard sizes the manifest claims:
  // the files must back those claims before anything is sized by it.
  for (const auto& info : m.shards) {
    const std::string path = dir + "/" + info.file;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return absl::NotFoundError("checkpoint shard " + path + " is missing: " + ec.message());
    if (size != info.bytes) return ShardSizeMismatch(path, size, info.bytes);
  }
  LoadedCheckpoint out;
  out.manifest = m;
  out.dir = dir;
  std::vector<uint8_t> covered(m.total_floats, 0);
  std::vector<std::string> array_names;  // every shard must hold the same arrays
  for (const auto& info : m.shards) {
    ASSIGN_OR_RETURN(auto shard, ReadShard(dir, info));
    std::vector<std::string> names;
    for (const auto& a : shard.arrays) names.push_back(a.first);
    if (&info == &m.shards.front()) {
      array_names = names;
    } else if (names != array_names) {
      return absl::DataLossError(dir + "/" + info.file + ": holds different arrays than the first shard");
    }
    for (const auto& [name, values] : shard.arrays) {
      auto& full = out.arrays[name];
      if (full.empty()) full.assign(m.total_floats, 0.f);
      uint64_t pos = 0;
      for (const Range& r : shard.ranges) {
        if (r.offset > m.total_floats || r.count > m.total_floats - r.offset) {
          return absl::DataLossError(dir + "/" + info.file + ": range past total_floats");
        }
        if (r.count > 0) std::memcpy(full.data() + r.offset, values.data() + pos, r.count * 4);
        pos += r.count;
      }
    }
    for (const Range& r : shard.ranges) {
      if (r.offset > m.total_floats || r.count > m.total_floats - r.offset) {
        return absl::DataLossError(dir + "/" + info.file + ": range past total_floats");
      }
      for (uint64_t i = r.offset; i < r.offset + r.count; ++i) {
        if (covered[i]++) {
          return absl::DataLossError(dir + ": element " + std::to_string(i) + " is stored by two shards");
        }
      }
    }
  }
  for (uint64_t i = 0; i < covered.size(); ++i) {
    if (!covered[i]) {
      return absl::DataLossError(dir + ": element " + std::to_string(i) + " is in no shard");
    }
  }
  return out;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) {
      continue;
    }
    char* end = nullptr;
    const long long step = std::strtoll(name.c_str() + 5, &end, 10);
    if (end == nullptr || *end != '\0') continue;
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

absl::StatusOr<LoadedCheckpoint> LoadLatestValid(const std::string& root, std::vector<std::string>* skipped) {
  for (const auto& [step, dir] : ListCheckpoints(root)) {
    auto c = LoadCheckpoint(dir);
    if (c.ok()) return c;
    if (skipped) skipped->push_back(dir + ": " + std::string(c.status().message()));
  }
  return absl::NotFoundError("no complete, valid checkpoint under " + root);
}

absl::Status ApplyRetention(const std::string& root, int keep) {
  if (keep <= 0) return absl::OkStatus();
  auto all = ListCheckpoints(root);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    fs::remove_all(all[i].second, ec);
    if (ec) return absl::InternalError("remove " + all[i].second + ": " + ec.message());
  }
  if (!all.empty()) {
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 8 && name.ends_with(".partial")) {
        const long long step = std::strtoll(name.c_str() + 5, nullptr, 10);
        if (step < all.front().first) fs::remove_all(e.path(), ec);
      }
    }
  }
  return FsyncPath(root);
}

}  // namespace tandem::ckpt
