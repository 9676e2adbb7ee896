#include "server/cli/tfevents_writer.h"

#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/crc32c.h"

namespace tandem::cli {
namespace {

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, uint32_t field, uint32_t wire_type) { PutVarint(out, (field << 3) | wire_type); }

template <typename T>
void PutLittleEndian(std::string* out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TFRecord and protobuf fixed fields are little-endian");
  out->append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void PutBytes(std::string* out, uint32_t field, const std::string& bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

std::string EventHeader(double wall_time) {
  std::string e;
  PutKey(&e, 1, kFixed64);  // wall_time
  PutLittleEndian(&e, wall_time);
  return e;
}

}  // namespace

std::string EncodeFileVersionEvent(double wall_time) {
  std::string e = EventHeader(wall_time);
  PutBytes(&e, 3, "brain.Event:2");  // file_version
  return e;
}

std::string EncodeScalarsEvent(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    PutBytes(&v, 1, tag);     // Summary.Value.tag
    PutKey(&v, 2, kFixed32);  // Summary.Value.simple_value
    PutLittleEndian(&v, static_cast<float>(value));
    PutBytes(&summary, 1, v);  // Summary.value
  }
  std::string e = EventHeader(wall_time);
  PutKey(&e, 2, kVarint);  // step (int64: negative values as 10-byte two's complement)
  PutVarint(&e, static_cast<uint64_t>(step));
  PutBytes(&e, 5, summary);  // summary
  return e;
}

std::string FrameTfRecord(const std::string& data) {
  std::string out;
  std::string length;
  PutLittleEndian(&length, static_cast<uint64_t>(data.size()));
  out += length;
  PutLittleEndian(&out, common::MaskCrc32c(common::Crc32c(length)));
  out += data;
  PutLittleEndian(&out, common::MaskCrc32c(common::Crc32c(data)));
  return out;
}

absl::StatusOr<std::unique_ptr<TfEventsWriter>> TfEventsWriter::Create(const std::filesystem::path& dir,
                                                                       double wall_time) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  std::filesystem::path path = dir / absl::StrCat("events.out.tfevents.", static_cast<int64_t>(wall_time), ".", host);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot create ", path.string()));
  std::unique_ptr<TfEventsWriter> w(new TfEventsWriter(path, std::move(out)));
  RETURN_IF_ERROR(w->Append(EncodeFileVersionEvent(wall_time)));
  return w;
}

absl::Status TfEventsWriter::Write(double wall_time, int64_t step, const Scalars& scalars) {
  if (scalars.empty()) return absl::OkStatus();
  return Append(EncodeScalarsEvent(wall_time, step, scalars));
}

absl::Status TfEventsWriter::Append(const std::string& event) {
  out_ << FrameTfRecord(event);
  out_.flush();
  if (!out_) return absl::DataLossError(absl::StrCat("cannot write ", path_.string()));
  return absl::OkStatus();
}

}  // namespace tandem::cli
