#include "ps/client/key_index_internal.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

namespace tessera::internal {
namespace {

// Dedupes `keys` with `index` and checks the result against a map built in the same order.
void ExpectDedupedLikeAMap(KeyIndex& index, const std::vector<uint64_t>& keys) {
  std::vector<uint64_t> unique;
  std::vector<uint32_t> unique_of(keys.size(), 0xdeadbeef);
  index.Dedupe(keys, &unique, unique_of.data());
  std::unordered_map<uint64_t, uint32_t> model;
  std::vector<uint64_t> model_unique;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = model.try_emplace(keys[i], static_cast<uint32_t>(model_unique.size()));
    if (fresh) model_unique.push_back(keys[i]);
    ASSERT_EQ(unique_of[i], it->second) << "key " << i << " of " << keys.size();
  }
  ASSERT_EQ(unique, model_unique);
}

TEST(KeyIndexTest, MatchesAMapAcrossCallsOfEverySize) {
  KeyIndex index;
  std::mt19937_64 rng(3);
  // Large, small, large again: entries of an earlier call never leak into a later one.
  for (size_t n : {100000, 10, 0, 1, 5000, 100000, 17}) {
    std::vector<uint64_t> keys(n);
    for (auto& k : keys) k = rng() % (n / 2 + 1);  // many repeats
    ExpectDedupedLikeAMap(index, keys);
  }
}

TEST(KeyIndexTest, GrowsWhenACallHasMoreUniqueKeysThanTheLastOne) {
  KeyIndex index;
  std::mt19937_64 rng(5);
  // A call of one repeated key sizes the next table small; the next call starts with 100k
  // distinct keys, so the table doubles within the call, then repeats every one of them: each
  // must still be found after the doublings.
  ExpectDedupedLikeAMap(index, std::vector<uint64_t>(50000, 7));
  std::vector<uint64_t> keys(100000);
  for (auto& k : keys) k = rng();
  keys.insert(keys.end(), keys.begin(), keys.end());
  ExpectDedupedLikeAMap(index, keys);
  ExpectDedupedLikeAMap(index, std::vector<uint64_t>(3, 7));
}

TEST(KeyIndexTest, KeysThatCollideStillGetTheirOwnIndex) {
  KeyIndex index;
  // Keys whose hashes share their low bits probe past each other in a small table.
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; keys.size() < 8; ++k) {
    if ((Mix64(k) & 15) == 3) keys.push_back(k);
  }
  keys.insert(keys.end(), keys.begin(), keys.end());
  ExpectDedupedLikeAMap(index, keys);
}

TEST(KeyIndexTest, StrictlyIncreasingRefusesRepeatsAndDisorder) {
  EXPECT_TRUE(StrictlyIncreasing(std::vector<uint64_t>{}));
  EXPECT_TRUE(StrictlyIncreasing(std::vector<uint64_t>{5}));
  EXPECT_TRUE(StrictlyIncreasing(std::vector<uint64_t>{0, 1, 7, ~uint64_t{0}}));
  EXPECT_FALSE(StrictlyIncreasing(std::vector<uint64_t>{1, 2, 2, 3}));  // a repeat
  EXPECT_FALSE(StrictlyIncreasing(std::vector<uint64_t>{1, 3, 2, 4}));
  EXPECT_FALSE(StrictlyIncreasing(std::vector<uint64_t>{4, 4}));
  EXPECT_FALSE(StrictlyIncreasing(std::vector<uint64_t>{9, 1}));
}

}  // namespace
}  // namespace tessera::internal
