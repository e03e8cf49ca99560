#include "ps/routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <vector>

namespace tessera {
namespace {

TEST(RoutingTest, Mix64IsTheMurmur3Finalizer) {
  // Known values of fmix64.
  EXPECT_EQ(Mix64(0), 0u);
  EXPECT_EQ(Mix64(1), 0xb456bcfc34c2cb2cULL);
  // A bijection: no collisions among many consecutive keys.
  std::set<uint64_t> seen;
  for (uint64_t k = 0; k < 100000; ++k) seen.insert(Mix64(k));
  EXPECT_EQ(seen.size(), 100000u);
}

TEST(RoutingTest, Unmix64InvertsMix64) {
  const uint64_t values[] = {0, 1, 42, ~uint64_t{0}, 0x8000000000000000ULL, 0x0123456789abcdefULL};
  for (uint64_t x : values) {
    EXPECT_EQ(Mix64(Unmix64(x)), x) << x;
    EXPECT_EQ(Unmix64(Mix64(x)), x) << x;
  }
  // A key of a chosen slot.
  EXPECT_EQ(SlotOfKey(Unmix64(uint64_t{1234} << 50 | 77)), 1234u);
}

TEST(RoutingTest, SlotsAreBalancedForSequentialKeys) {
  std::vector<int> count(kNumSlots, 0);
  const int n = 1 << 22;
  for (int k = 0; k < n; ++k) ++count[SlotOfKey(k)];
  const double mean = double(n) / kNumSlots;
  for (int c : count) {
    EXPECT_GT(c, mean * 0.75);
    EXPECT_LT(c, mean * 1.25);
  }
}

TEST(RoutingTest, UniformSlotMapIsContiguousAndBalanced) {
  for (uint32_t n : {1u, 2u, 3u, 7u, 64u}) {
    SlotMap m = SlotMap::Uniform(n);
    std::vector<int> per(n, 0);
    uint32_t prev = 0;
    for (uint32_t s = 0; s < kNumSlots; ++s) {
      uint32_t o = m.ServerOfSlot(s);
      ASSERT_LT(o, n);
      ASSERT_GE(o, prev);  // contiguous ranges in rank order
      prev = o;
      ++per[o];
    }
    for (int c : per) EXPECT_NEAR(c, double(kNumSlots) / n, 1.0);
  }
}

TEST(RoutingTest, FromOwnersValidates) {
  EXPECT_FALSE(SlotMap::FromOwners({1, 2, 3}, 4).ok());
  std::vector<uint16_t> owners(kNumSlots, 0);
  owners[5] = 3;
  EXPECT_FALSE(SlotMap::FromOwners(owners, 3).ok());
  auto m = SlotMap::FromOwners(owners, 4);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ServerOfSlot(5), 3u);
}

TEST(RoutingTest, DenseRangesPartitionTheTensor) {
  for (uint64_t len : std::vector<uint64_t>{1, 100, kDenseChunkFloats, kDenseChunkFloats * 5 + 3,
                                            kDenseChunkFloats * 64}) {
    for (uint32_t n : {1u, 2u, 3u}) {
      for (uint64_t table : std::vector<uint64_t>{1, 2, 12345}) {
        uint64_t covered = 0;
        std::vector<std::pair<uint64_t, uint64_t>> parts;
        for (uint32_t s = 0; s < n; ++s) {
          DenseRange r = DenseRangeOfServer(table, len, s, n);
          ASSERT_LE(r.begin, r.end);
          ASSERT_EQ(r.begin % kDenseChunkFloats, 0u);
          covered += r.end - r.begin;
          if (r.end > r.begin) parts.emplace_back(r.begin, r.end);
        }
        EXPECT_EQ(covered, len);
        std::sort(parts.begin(), parts.end());
        for (size_t i = 1; i < parts.size(); ++i) EXPECT_EQ(parts[i - 1].second, parts[i].first);
      }
    }
  }
}

TEST(RoutingTest, ParseClusterList) {
  auto a = ParseClusterList("tcp://a:1,tcp://b:2");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  EXPECT_FALSE(ParseClusterList("").ok());
  EXPECT_FALSE(ParseClusterList("@/nonexistent/file").ok());
  const std::string path = ::testing::TempDir() + "/cluster.txt";
  {
    std::ofstream f(path);
    f << "# servers\n tcp://x:1 \n\ntcp://y:2\n";
  }
  auto b = ParseClusterList("@" + path);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<std::string>{"tcp://x:1", "tcp://y:2"}));
  {
    std::ofstream f(path);
    f << "tcp://x:1\ntcp://y:70000\n";
  }
  auto bad = ParseClusterList("@" + path);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'tcp://y:70000'"), std::string::npos)
      << bad.status().ToString();
  std::remove(path.c_str());
  auto spaced = ParseClusterList("tcp://a:1, tcp://b:2 ");
  ASSERT_TRUE(spaced.ok()) << spaced.status().ToString();
  EXPECT_EQ(*spaced, (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
}

// A port out of range is an error naming the endpoint (it used to wrap silently at connect).
TEST(RoutingTest, ParseClusterListRejectsBadEndpoints) {
  auto wrapped = ParseClusterList("tcp://127.0.0.1:7000,tcp://127.0.0.1:99999");
  ASSERT_FALSE(wrapped.ok());
  EXPECT_EQ(wrapped.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrapped.status().message().find("'tcp://127.0.0.1:99999'"), std::string::npos)
      << wrapped.status().ToString();
  EXPECT_NE(wrapped.status().message().find("1..65535"), std::string::npos)
      << wrapped.status().ToString();
  for (const char* bad : {"tcp://h:0", "tcp://h:65536", "tcp://h:-1", "tcp://h:+80", "tcp://h:",
                          "tcp://h:7x", "tcp://h", "tcp://:7000", "h:7000", "udp://h:7000",
                          "tcp://h:*", "tcp://a b:1"}) {
    EXPECT_FALSE(ValidateEndpoint(bad).ok()) << bad;
    EXPECT_FALSE(ParseClusterList(bad).ok()) << bad;
  }
  for (const char* good : {"tcp://h:1", "tcp://h:65535", "tcp://10.0.0.1:7000",
                           "tcp://[::1]:7000", "tcp://tessera-server-0.tessera:7000"}) {
    EXPECT_TRUE(ValidateEndpoint(good).ok()) << good << ": " << ValidateEndpoint(good).ToString();
  }
  // A bind address may ask for a free port; a connect address may not.
  EXPECT_TRUE(ValidateEndpoint("tcp://127.0.0.1:*", /*allow_any_port=*/true).ok());
  EXPECT_TRUE(ValidateEndpoint("tcp://*:7000", /*allow_any_port=*/true).ok());
  EXPECT_FALSE(ValidateEndpoint("tcp://127.0.0.1:99999", /*allow_any_port=*/true).ok());
}

}  // namespace
}  // namespace tessera
