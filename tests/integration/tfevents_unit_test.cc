// TensorBoard event encoding byte for byte (protobuf wire format and
// TFRecord framing), and TensorBoardLog: scalars flattened from a
// metrics.jsonl object, a re-reported step writes only what changed.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "server/cli/tensorboard_log.h"
#include "server/cli/tfevents_writer.h"

namespace tandem::cli {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

TEST(TfEventsTest, ScalarEventWireFormat) {
  // wall_time 1.5 (field 1, fixed64), step 3 (field 2, varint), summary
  // (field 5) { value (1) { tag (1) "a", simple_value (2, fixed32) 2.0f } }.
  const std::string want = Bytes(
      {0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x10, 0x03, 0x2A, 0x0A, 0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0, 0, 0, 0x40});
  EXPECT_EQ(EncodeScalarsEvent(1.5, 3, {{"a", 2.0}}), want);
  // A negative step is a 10-byte varint (int64, two's complement).
  const std::string e = EncodeScalarsEvent(0, -1, {});
  EXPECT_EQ(e.substr(9, 11), Bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  EXPECT_EQ(EncodeFileVersionEvent(0).substr(9),
            "\x1a\x0d"
            "brain.Event:2");
}

TEST(TfEventsTest, RecordFraming) {
  const std::string data = "hello";
  const std::string r = FrameTfRecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(r.substr(0, 8), Bytes({5, 0, 0, 0, 0, 0, 0, 0}));
  auto u32 = [&](size_t at) {
    return static_cast<uint32_t>(static_cast<unsigned char>(r[at])) |
           static_cast<uint32_t>(static_cast<unsigned char>(r[at + 1])) << 8 |
           static_cast<uint32_t>(static_cast<unsigned char>(r[at + 2])) << 16 |
           static_cast<uint32_t>(static_cast<unsigned char>(r[at + 3])) << 24;
  };
  EXPECT_EQ(u32(8), common::MaskCrc32c(common::Crc32c(r.substr(0, 8))));
  EXPECT_EQ(r.substr(12, 5), data);
  EXPECT_EQ(u32(17), common::MaskCrc32c(common::Crc32c(data)));
  // TensorFlow's mask: rotate right 15, add 0xa282ead8.
  EXPECT_EQ(common::MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(common::MaskCrc32c(1u << 15), 0xa282ead9u);
}

TEST(TensorBoardLogTest, FlattensAndWritesOnlyChanges) {
  const nlohmann::json step = nlohmann::json::parse(
      R"({"step": 2, "loss": 0.5, "wall_time": 10.0, "phase_seconds": {"update": 0.25}, "name": "x"})");
  EXPECT_EQ(StepScalars(step), (Scalars{{"loss", 0.5}, {"phase_seconds/update", 0.25}}));

  const auto dir = std::filesystem::path(testing::TempDir()) / "tensorboard_log_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "events.out.tfevents.1.old") << "stale";
  auto log = TensorBoardLog::Create(dir);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_FALSE(std::filesystem::exists(dir / "events.out.tfevents.1.old"));
  ASSERT_TRUE((*log)->Record(step).ok());
  nlohmann::json again = step;
  again["accuracy"] = 0.75;
  ASSERT_TRUE((*log)->Record(again).ok());
  EXPECT_FALSE((*log)->Record(nlohmann::json::parse(R"({"loss": 1})")).ok());

  std::ifstream in((*log)->path(), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The file_version record, then the step's scalars, then only the new one.
  const std::string expected = FrameTfRecord(EncodeScalarsEvent(10.0, 2, StepScalars(step))) +
                               FrameTfRecord(EncodeScalarsEvent(10.0, 2, {{"accuracy", 0.75}}));
  ASSERT_GT(file.size(), expected.size());
  EXPECT_EQ(file.substr(file.size() - expected.size()), expected);
}

}  // namespace
}  // namespace tandem::cli
