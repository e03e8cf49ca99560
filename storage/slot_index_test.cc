#include "storage/slot_index_internal.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace tessera::internal {
namespace {

// Every key of `model` is found with its slot, ForEach visits exactly the model, and `absent`
// keys are not found.
void ExpectSameAs(const SlotIndex& index, const std::unordered_map<uint64_t, uint32_t>& model,
                  const std::vector<uint64_t>& absent) {
  ASSERT_EQ(index.size(), model.size());
  for (const auto& [key, slot] : model) {
    const uint32_t* found = index.Find(key);
    ASSERT_NE(found, nullptr) << "key " << key;
    ASSERT_EQ(*found, slot) << "key " << key;
  }
  for (uint64_t key : absent) {
    if (model.count(key) == 0) {
      ASSERT_EQ(index.Find(key), nullptr) << "key " << key;
    }
  }
  size_t visited = 0;
  index.ForEach([&](uint64_t key, uint32_t slot) {
    EXPECT_EQ(model.at(key), slot);
    ++visited;
    return true;
  });
  EXPECT_EQ(visited, model.size());
}

TEST(SlotIndexTest, MatchesAMapThroughInsertsErasesAndGrowth) {
  SlotIndex index;
  std::unordered_map<uint64_t, uint32_t> model;
  std::mt19937_64 rng(9);
  std::vector<uint64_t> seen;
  // Keys from a small range, so erased keys come back and runs of colliding entries form; the
  // table grows from 16 entries through many doublings.
  for (int round = 0; round < 40; ++round) {
    for (int i = 0; i < 500; ++i) {
      const uint64_t key = rng() % 3000;
      seen.push_back(key);
      if (rng() % 3 == 0) {
        EXPECT_EQ(index.Erase(key), model.erase(key) == 1) << "erase " << key;
      } else {
        const uint32_t slot = static_cast<uint32_t>(rng());
        auto [at, inserted] = index.TryEmplace(key, slot);
        auto [it, fresh] = model.try_emplace(key, slot);
        ASSERT_EQ(inserted, fresh) << "key " << key;
        ASSERT_EQ(*at, it->second) << "key " << key;
      }
    }
    ExpectSameAs(index, model, seen);
  }
  // Empty it: every key erased once, none left behind.
  for (const auto& [key, slot] : std::unordered_map<uint64_t, uint32_t>(model)) {
    ASSERT_TRUE(index.Erase(key));
  }
  EXPECT_EQ(index.size(), 0u);
  ExpectSameAs(index, {}, seen);
}

TEST(SlotIndexTest, ErasingFromTheMiddleOfACollidingRunKeepsTheRestFindable) {
  SlotIndex index(0);  // 16 entries: 8 keys whose probes start at the same entry
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; keys.size() < 8; ++k) {
    if ((Mix64(k) & 15) == 14) keys.push_back(k);  // the run wraps around the table's end
  }
  std::unordered_map<uint64_t, uint32_t> model;
  for (uint32_t i = 0; i < keys.size(); ++i) {
    index.TryEmplace(keys[i], i);
    model[keys[i]] = i;
  }
  for (size_t victim : {3u, 0u, 6u}) {
    ASSERT_TRUE(index.Erase(keys[victim]));
    model.erase(keys[victim]);
    ExpectSameAs(index, model, keys);
  }
  EXPECT_FALSE(index.Erase(keys[3]));
}

// Keys inserted in another table's order (a slot move, a restore: rows scanned from one table
// fill another) probe no further than random ones. With one hash for every table they arrive
// sorted by home entry; while the filling table is smaller than the scanned one, the second
// half of its entries gets a second round of keys on top of the first, and they pile up into
// one run that every later insert walks (quadratic time to fill).
TEST(SlotIndexTest, FillingInAnotherTablesOrderKeepsProbesShort) {
  SlotIndex source;
  std::mt19937_64 rng(11);
  while (source.size() < 183500) source.TryEmplace(rng(), 0);  // 0.7 of 2^18 entries
  SlotIndex target;
  // 98,000 keys: the target stays at 2^17 entries.
  source.ForEach([&](uint64_t key, uint32_t) {
    target.TryEmplace(key, 0);
    return target.size() < 98000;
  });
  ASSERT_EQ(target.capacity(), size_t{1} << 17);
  EXPECT_LT(target.MaxDisplacement(), 1000u);
  EXPECT_LT(source.MaxDisplacement(), 1000u);
}

}  // namespace
}  // namespace tessera::internal
