// CRC-32C (common/crc32c.h) against published test vectors.
#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::common {
namespace {

TEST(Crc32cTest, KnownVectors) {
  // The check value of CRC-32C and the iSCSI vectors of RFC 3720, B.4.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32cExtend(Crc32c("1234"), "56789"), 0xE3069283u);
}

}  // namespace
}  // namespace tandem::common
