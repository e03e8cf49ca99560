#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "storage/slot_tag_index_internal.h"

namespace tessera::internal {
namespace {

// The arena the index points into: the key stored in each slot.
struct Keys {
  std::vector<uint64_t>* keys;
  uint64_t operator()(uint32_t slot) const { return keys->at(slot); }
};
using Index = SlotTagIndex<Keys>;

// Every key of `model` is found in its slot (and its Candidate is its slot or a slot whose tag
// matches first, never "absent"); `absent` keys are not found.
void ExpectSameAs(const Index& index, const std::vector<uint64_t>& keys,
                  const std::unordered_map<uint64_t, uint32_t>& model,
                  const std::vector<uint64_t>& absent) {
  ASSERT_EQ(index.size(), model.size());
  for (const auto& [key, slot] : model) {
    ASSERT_EQ(index.Find(key), slot) << "key " << key;
    const uint32_t c = index.Candidate(key);
    ASSERT_NE(c, Index::kNoSlot) << "key " << key;
    if (c != slot) {
      ASSERT_NE(keys[c], key);
    }
  }
  for (uint64_t key : absent) {
    if (model.count(key) == 0) {
      ASSERT_EQ(index.Find(key), Index::kNoSlot) << "key " << key;
    }
  }
}

// Keys whose hashes (seed 0) share the low 20 bits (the home entry in a table of up to 2^20)
// and the top 32 (every tag width): same probe, same tag, different keys.
std::vector<uint64_t> CollidingKeys(size_t n) {
  std::vector<uint64_t> keys;
  for (uint64_t j = 1; j <= n; ++j) keys.push_back(Unmix64(0xabcd1234'00000777ull | (j << 20)));
  return keys;
}

TEST(SlotTagIndexTest, MatchesAMapThroughInsertsErasesAndGrowth) {
  std::vector<uint64_t> keys;
  Index index(Keys{&keys});
  std::unordered_map<uint64_t, uint32_t> model;
  std::vector<uint32_t> free_slots;
  std::mt19937_64 rng(9);
  std::vector<uint64_t> seen;
  for (int round = 0; round < 200000; ++round) {
    const uint64_t key = rng() % 20000;
    seen.push_back(key);
    auto it = model.find(key);
    ASSERT_EQ(index.Find(key), it == model.end() ? Index::kNoSlot : it->second) << key;
    if (it == model.end()) {
      uint32_t slot;
      if (free_slots.empty()) {
        slot = static_cast<uint32_t>(keys.size());
        keys.push_back(key);
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
        keys[slot] = key;
      }
      index.Insert(key, slot);
      model[key] = slot;
    } else if (rng() % 2 == 0) {
      ASSERT_TRUE(index.Erase(key, it->second));
      keys[it->second] = ~uint64_t{0};  // the arena reuses the slot: no longer the key
      free_slots.push_back(it->second);
      model.erase(it);
    }
  }
  ExpectSameAs(index, keys, model, seen);
  EXPECT_FALSE(index.Erase(~uint64_t{1}, 0));
}

TEST(SlotTagIndexTest, KeysWithTheSameTagAndHomeAreEachFoundAndErasable) {
  std::vector<uint64_t> keys = CollidingKeys(12);
  Index index(Keys{&keys}, 0);
  std::unordered_map<uint64_t, uint32_t> model;
  for (uint32_t s = 0; s < keys.size(); ++s) {
    ASSERT_EQ(index.Find(keys[s]), Index::kNoSlot);
    index.Insert(keys[s], s);
    model[keys[s]] = s;
  }
  // One run: the first key's slot is every later key's candidate (its tag matches first).
  EXPECT_EQ(index.Candidate(keys[5]), 0u);
  EXPECT_GE(index.MaxDisplacement(), keys.size() - 1);
  ExpectSameAs(index, keys, model, {});
  // Erasing from the front and the middle of the run keeps the rest findable.
  for (uint32_t s : {0u, 5u, 6u, 11u}) {
    ASSERT_TRUE(index.Erase(keys[s], s));
    model.erase(keys[s]);
    ASSERT_EQ(index.Find(keys[s]), Index::kNoSlot);
    ExpectSameAs(index, keys, model, {});
  }
  // Erasing by another slot than the key's is refused and changes nothing.
  EXPECT_FALSE(index.Erase(keys[1], 2));
  ExpectSameAs(index, keys, model, {});
  // Re-inserted (in other slots), each is found again.
  for (uint32_t s : {5u, 0u}) {
    keys.push_back(keys[s]);
    const uint32_t slot = static_cast<uint32_t>(keys.size() - 1);
    index.Insert(keys[s], slot);
    model[keys[s]] = slot;
  }
  ExpectSameAs(index, keys, model, {keys[6], keys[11]});
}

TEST(SlotTagIndexTest, SlotNumbersPastTheTagWidthNarrowTheTagsAndKeepEveryKey) {
  std::vector<uint64_t> keys;
  Index index(Keys{&keys}, 0);
  std::unordered_map<uint64_t, uint32_t> model;
  EXPECT_EQ(index.slot_bits(), 16u);
  std::mt19937_64 rng(4);
  // Slots 0..999 and then far apart, up to past 2^21.
  std::vector<uint32_t> slots;
  for (uint32_t s = 0; s < 1000; ++s) slots.push_back(s);
  for (uint32_t s : {65534u, 65535u, 70000u, 1u << 20, (1u << 21) + 3}) slots.push_back(s);
  for (uint32_t s : slots) {
    if (keys.size() <= s) keys.resize(s + 1, ~uint64_t{0});
    keys[s] = rng();
    index.Insert(keys[s], s);
    model[keys[s]] = s;
  }
  EXPECT_GE(index.slot_bits(), 22u);
  ExpectSameAs(index, keys, model, {1, 2, 3});
  // Erased and renumbered down (as Compact does) with the narrower tags.
  ASSERT_TRUE(index.Erase(keys[70000], 70000));
  model.erase(keys[70000]);
  const uint32_t top = (1u << 21) + 3;
  ASSERT_TRUE(index.Renumber(keys[top], top, 70000));
  keys[70000] = keys[top];
  model[keys[top]] = 70000;
  ExpectSameAs(index, keys, model, {});
}

TEST(SlotTagIndexTest, RenumberMovesAnEntryAndShrinkKeepsTheRest) {
  std::vector<uint64_t> keys;
  Index index(Keys{&keys});
  std::unordered_map<uint64_t, uint32_t> model;
  for (uint32_t s = 0; s < 5000; ++s) {
    keys.push_back(Mix64(s + 1));
    index.Insert(keys[s], s);
    model[keys[s]] = s;
  }
  // Erase the lower half, then move the upper half down into its slots (Compact's order).
  for (uint32_t s = 0; s < 2500; ++s) {
    ASSERT_TRUE(index.Erase(keys[s], s));
    model.erase(keys[s]);
  }
  EXPECT_FALSE(index.Renumber(keys[0], 0, 1));  // erased
  for (uint32_t s = 2500; s < 5000; ++s) {
    ASSERT_TRUE(index.Renumber(keys[s], s, s - 2500));
    keys[s - 2500] = keys[s];
    model[keys[s]] = s - 2500;
  }
  keys.resize(2500);
  const size_t before = index.capacity();
  index.ShrinkToFit();
  EXPECT_LT(index.capacity(), before);
  EXPECT_LE(4 * index.size(), 3 * index.capacity());
  ExpectSameAs(index, keys, model, {Mix64(1), Mix64(2)});
}

}  // namespace
}  // namespace tessera::internal
