#include "ps/client/key_index_internal.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace tessera::internal {
namespace {

TEST(KeyIndexTest, MatchesAMapAcrossCallsOfEverySize) {
  KeyIndex index;
  std::mt19937_64 rng(3);
  // Large, small, large again: entries of an earlier call never leak into a later one.
  for (size_t n : {100000, 10, 0, 1, 5000, 100000, 17}) {
    index.Reset(n);
    std::unordered_map<uint64_t, uint32_t> model;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t key = rng() % (n / 2 + 1);  // many repeats
      const uint32_t next = static_cast<uint32_t>(model.size());
      auto [idx, inserted] = index.Insert(key, next);
      auto [it, fresh] = model.try_emplace(key, next);
      ASSERT_EQ(inserted, fresh) << "call of " << n << ", key " << key;
      ASSERT_EQ(idx, it->second);
    }
  }
}

TEST(KeyIndexTest, KeysThatCollideStillGetTheirOwnIndex) {
  KeyIndex index;
  index.Reset(8);  // 16 slots: 8 keys probe past each other
  for (uint32_t i = 0; i < 8; ++i) EXPECT_TRUE(index.Insert(i * 16, i).second);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(index.Insert(i * 16, 99).first, i);
}

}  // namespace
}  // namespace tessera::internal
