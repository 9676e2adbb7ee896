// Bandwidth texts (common/bandwidth.h), the worker's tier_bandwidth config
// key and the coordinator's check of RegisterWorkerRequest.tier_bandwidth.
#include "common/bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/daemon_config.h"
#include "server/clock.h"
#include "server/membership/membership.h"

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

TEST(BandwidthTest, WorkerConfigKey) {
  auto ok = LoadWorkerConfig("", {"tier_bandwidth=intra=10Gbit,inter=1Gbit"});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tier_bandwidth(), "intra=10Gbit,inter=1Gbit");
  EXPECT_TRUE(LoadWorkerConfig("", {}).ok());
  auto bad = LoadWorkerConfig("", {"tier_bandwidth=intra=10Gbit,inter=0Mbit"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tier_bandwidth"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("above zero"), std::string::npos) << bad.status();
}

tandem::v1::RegisterWorkerRequest Reg(const std::string& name, double intra, double inter) {
  tandem::v1::RegisterWorkerRequest r;
  r.set_name(name);
  r.set_host("h");
  r.set_node("n1");
  r.mutable_tier_bandwidth()->set_intra_bytes_per_s(intra);
  r.mutable_tier_bandwidth()->set_inter_bytes_per_s(inter);
  return r;
}

TEST(BandwidthTest, CoordinatorKeepsTheHintAndRefusesBadValues) {
  tandem::v1::CoordinatorConfig config;
  config.set_lease_ms(3000);
  server::ManualClock clock;
  server::Membership m(config, nullptr, &clock);
  auto a = m.Register(Reg("a", 1.25e9, 1.25e8), -1);
  ASSERT_TRUE(a.ok()) << a.status();
  auto info = m.Get(a->worker_id);
  ASSERT_TRUE(info.ok());
  EXPECT_DOUBLE_EQ(info->tier_bandwidth().intra_bytes_per_s(), 1.25e9);
  EXPECT_DOUBLE_EQ(info->tier_bandwidth().inter_bytes_per_s(), 1.25e8);
  tandem::v1::RegisterWorkerRequest plain = Reg("b", 1, 1);
  plain.clear_tier_bandwidth();
  auto b = m.Register(plain, -1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(m.Get(b->worker_id)->has_tier_bandwidth());
  for (auto [intra, inter] : {std::pair<double, double>{0, 1e8},
                              {1e9, -1},
                              {std::nan(""), 1e8},
                              {1e9, std::numeric_limits<double>::infinity()},
                              {1e9, 1e16}}) {
    auto r = m.Register(Reg("c", intra, inter), -1);
    ASSERT_FALSE(r.ok()) << intra << " " << inter;
    EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
    EXPECT_NE(r.status().message().find("tier_bandwidth"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace tandem::common
