// Bandwidth texts (common/bandwidth.h): the four units, strict parsing with
// the text in every error, the per-tier pair "intra=X,inter=Y".
#include "common/bandwidth.h"

#include <gtest/gtest.h>

namespace tandem::common {
namespace {

TEST(BandwidthTest, ParsesTheFourUnits) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("10Gbit"), 1.25e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("800Mbit"), 1e8);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1.5GB/s"), 1.5e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("200MB/s"), 2e8);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("0.5Gbit"), 6.25e7);
}

TEST(BandwidthTest, RefusesBadTextWithTheText) {
  for (const char* bad : {"", "10", "Gbit", "10 Gbit", "10gbit", "10Gb", "-1Gbit", "0Gbit", "0MB/s", "nanGbit",
                          "infGbit", "1e300GB/s", "9e6GB/s", "10Gbit/s", "ten Mbit", "10Gbitx", " 10Gbit"}) {
    auto r = ParseBandwidth(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_NE(r.status().message().find(std::string("\"") + bad + "\""), std::string::npos) << r.status();
  }
  EXPECT_NE(ParseBandwidth("-1Gbit").status().message().find("above zero"), std::string::npos);
  EXPECT_NE(ParseBandwidth("9e6GB/s").status().message().find("limit"), std::string::npos);
}

TEST(BandwidthTest, TierPairs) {
  auto t = ParseTierBandwidth("intra=10Gbit,inter=1Gbit");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->intra_bytes_per_s, 1.25e9);
  EXPECT_DOUBLE_EQ(t->inter_bytes_per_s, 1.25e8);
  t = ParseTierBandwidth("inter=100MB/s,intra=2GB/s");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->intra_bytes_per_s, 2e9);
  EXPECT_DOUBLE_EQ(t->inter_bytes_per_s, 1e8);
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},
      {"intra=10Gbit", "missing inter"},
      {"inter=1Gbit", "missing intra"},
      {"intra=10Gbit,inter=1Gbit,intra=5Gbit", "intra given twice"},
      {"intra=10Gbit,inter=0Gbit", "above zero"},
      {"intra=10Gbit,inter=-1Gbit", "above zero"},
      {"intra=10Gbit,cross=1Gbit", "unknown tier \"cross\""},
      {"intra=10Gbit;inter=1Gbit", "not a number"},
      {"intra=10Gbit,inter", "has no '='"},
      {"intra=10Gbit,inter=1e20Gbit", "limit"},
  };
  for (const auto& [text, why] : bad) {
    auto r = ParseTierBandwidth(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << text << ": " << r.status();
  }
}

TEST(BandwidthTest, Formats) {
  EXPECT_EQ(FormatBandwidth(1.25e9), "10 Gbit/s");
  EXPECT_EQ(FormatBandwidth(1.25e8), "1 Gbit/s");
  EXPECT_EQ(FormatBandwidth(1e8), "800 Mbit/s");
  EXPECT_EQ(FormatBandwidth(100), "800 bit/s");
}

}  // namespace
}  // namespace tandem::common
