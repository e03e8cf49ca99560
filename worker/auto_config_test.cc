// Defaults from the data: the profile counts distinct keys per field, and the documented rules
// (embedding width k^0.25 to a multiple of 4 in [4, 32]; MLPs 8 * width in [64, 256]).
#include "worker/auto_config.h"

#include <gtest/gtest.h>

#include <cmath>

#include "worker/synthetic_data.h"

namespace tessera::worker {
namespace {

// `n` samples of 2 fields and 1 dense feature: field 0 takes key s % 7 (7 distinct), field 1 a
// bag of two keys, 1000 + s and 1000 + s + 1 (n + 1 distinct).
Batch TwoFields(uint32_t n) {
  Batch b;
  b.Clear({.num_dense = 1, .num_fields = 2});
  for (uint32_t s = 0; s < n; ++s) {
    b.dense.push_back(0.5f);
    b.labels.push_back(static_cast<float>(s % 2));
    b.keys.push_back(s % 7);
    b.offsets.push_back(static_cast<uint32_t>(b.keys.size()));
    b.keys.push_back(1000 + s);
    b.keys.push_back(1000 + s + 1);
    b.offsets.push_back(static_cast<uint32_t>(b.keys.size()));
    ++b.size;
  }
  return b;
}

TEST(AutoConfig, ProfileCountsDistinctKeysPerFieldUpToTheBound) {
  auto reader = InMemoryReader(TwoFields(500));
  auto all = ProfileData(reader.get());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->samples, 500u);
  EXPECT_EQ(all->num_dense, 1u);
  ASSERT_EQ(all->distinct_keys.size(), 2u);
  EXPECT_EQ(all->distinct_keys[0], 7u);
  EXPECT_EQ(all->distinct_keys[1], 501u);
  EXPECT_DOUBLE_EQ(all->MeanDistinctKeys(), (7 + 501) / 2.0);

  ASSERT_TRUE(reader->Rewind().ok());
  auto first = ProfileData(reader.get(), 100);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->samples, 100u);
  EXPECT_EQ(first->distinct_keys[1], 101u);

  EXPECT_EQ(ProfileData(nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(AutoConfig, MeanLeavesOutFieldsWithoutKeys) {
  DataProfile p;
  p.distinct_keys = {0, 100, 300};
  EXPECT_DOUBLE_EQ(p.MeanDistinctKeys(), 200);
  p.distinct_keys = {0, 0};
  EXPECT_EQ(p.MeanDistinctKeys(), 0);
}

TEST(AutoConfig, EmbeddingWidthFollowsTheFourthRootOfTheKeysAField) {
  auto width = [](double k) {
    DataProfile p;
    p.distinct_keys = {static_cast<uint64_t>(k)};
    return DefaultEmbeddingDim(p);
  };
  EXPECT_EQ(DefaultEmbeddingDim(DataProfile{}), 4u);  // no keys
  EXPECT_EQ(width(1), 4u);
  EXPECT_EQ(width(300), 4u);      // 4.16
  EXPECT_EQ(width(1660), 8u);     // 6.38 (MovieLens ml-latest-small)
  EXPECT_EQ(width(2462), 8u);     // 7.04 (the generated default data)
  EXPECT_EQ(width(20000), 12u);   // 11.9
  EXPECT_EQ(width(65536), 16u);   // 16
  EXPECT_EQ(width(1e6), 32u);     // 31.6
  EXPECT_EQ(width(1e8), 32u);     // 100: clamped
  // Never below 4 nor above 32, a multiple of 4, and never narrower for more keys.
  uint32_t last = 0;
  for (double k = 1; k < 1e9; k *= 1.7) {
    const uint32_t w = width(k);
    EXPECT_EQ(w % 4, 0u) << k;
    EXPECT_GE(w, 4u);
    EXPECT_LE(w, 32u);
    EXPECT_GE(w, last) << k;
    last = w;
  }
}

TEST(AutoConfig, MlpIsEightTimesTheWidthClamped) {
  EXPECT_EQ(DefaultMlp(4), "64");
  EXPECT_EQ(DefaultMlp(8), "64");
  EXPECT_EQ(DefaultMlp(12), "96");
  EXPECT_EQ(DefaultMlp(16), "128");
  EXPECT_EQ(DefaultMlp(32), "256");
  EXPECT_EQ(DefaultMlp(64), "256");
}

}  // namespace
}  // namespace tessera::worker
