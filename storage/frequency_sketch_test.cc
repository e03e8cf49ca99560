// FrequencySketch: estimates never below the counts of the current period, hot keys above cold
// ones among many, and aging.
#include <gtest/gtest.h>

#include <cstdint>

#include "ps/routing.h"
#include "storage/frequency_sketch_internal.h"

namespace tessera::internal {
namespace {

TEST(FrequencySketchTest, EstimatesAreAtLeastTheCountsUpToFifteen) {
  FrequencySketch sketch(4096);
  for (uint64_t k = 0; k < 1000; ++k) {
    for (uint64_t n = 0; n < k % 20; ++n) sketch.Add(Mix64(k));
  }
  for (uint64_t k = 0; k < 1000; ++k) {
    EXPECT_GE(sketch.Estimate(Mix64(k)), std::min<uint64_t>(k % 20, 15)) << k;
  }
  EXPECT_EQ(sketch.Estimate(Mix64(123456789)) <= 2, true);  // unseen: at most a collision or two
}

TEST(FrequencySketchTest, HotKeysStandAboveAStreamOfOnceSeenKeys) {
  constexpr size_t kCapacity = 1000;
  FrequencySketch sketch(kCapacity);
  // 100 hot keys seen 8 times each, between 50,000 keys seen once (several aging periods).
  uint64_t cold = 1u << 20;
  for (int round = 0; round < 50; ++round) {
    for (uint64_t k = 0; k < 100; ++k) sketch.Add(Mix64(k));
    for (int i = 0; i < 1000; ++i) sketch.Add(Mix64(cold++));
  }
  int hot_above = 0, cold_high = 0;
  for (uint64_t k = 0; k < 100; ++k) hot_above += sketch.Estimate(Mix64(k)) >= 3;
  for (uint64_t k = 1u << 20; k < cold; ++k) cold_high += sketch.Estimate(Mix64(k)) >= 3;
  EXPECT_EQ(hot_above, 100);
  EXPECT_LT(cold_high, 50000 / 20) << "cold keys estimated as often seen as hot ones";
}

TEST(FrequencySketchTest, CountsHalveEveryPeriod) {
  FrequencySketch sketch(512);  // period: 10 x 512 additions that changed a counter
  for (int i = 0; i < 12; ++i) sketch.Add(Mix64(7));
  ASSERT_EQ(sketch.Estimate(Mix64(7)), 12u);
  for (uint64_t k = 100; k < 100 + 10 * 512; ++k) sketch.Add(Mix64(k));
  EXPECT_LE(sketch.Estimate(Mix64(7)), 6u + 1u);  // halved once (a collision may add one)
  EXPECT_GE(sketch.Estimate(Mix64(7)), 6u);
}

}  // namespace
}  // namespace tessera::internal
