#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "storage/row_cache_internal.h"

namespace tessera::internal {
namespace {

TEST(CachedRowsTest, InsertFindEraseAgainstAMap) {
  CachedRows rows(5);
  std::map<uint64_t, float> model;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t key = rng() % 3000;
    const uint32_t slot = rows.Find(key);
    ASSERT_EQ(slot != CachedRows::kNoSlot, model.contains(key)) << key;
    if (slot == CachedRows::kNoSlot) {
      const uint32_t s = rows.Insert(key);
      for (int j = 0; j < 5; ++j) rows.row(s)[j] = static_cast<float>(key) + j;
      model[key] = static_cast<float>(key);
    } else if (rng() % 3 == 0) {
      rows.Erase(slot);
      model.erase(key);
    } else {
      ASSERT_EQ(rows.header(slot).key, key);
      for (int j = 0; j < 5; ++j) ASSERT_EQ(rows.row(slot)[j], model[key] + j);
    }
  }
  EXPECT_EQ(rows.size(), model.size());
}

TEST(CachedRowsTest, ClockGivesReferencedRowsASecondChanceAndSkipsPinned) {
  CachedRows rows(1);
  std::vector<uint32_t> slots;
  for (uint64_t k = 0; k < 4; ++k) slots.push_back(rows.Insert(k));
  // Newly inserted rows are referenced: the first turn clears the bits, then row 0 goes.
  rows.Pin(slots[0]);
  uint32_t v = rows.NextVictim();
  ASSERT_NE(v, CachedRows::kNoSlot);
  EXPECT_EQ(rows.header(v).key, 1u);  // row 0 is pinned
  rows.Erase(v);
  rows.header(slots[2]).flags |= CachedRows::kReferenced;  // used again: survives this turn
  v = rows.NextVictim();
  EXPECT_EQ(rows.header(v).key, 3u);
  rows.Erase(v);
  v = rows.NextVictim();
  EXPECT_EQ(rows.header(v).key, 2u);
  rows.Erase(v);
  EXPECT_EQ(rows.NextVictim(), CachedRows::kNoSlot);  // only the pinned row is left
  rows.Unpin(slots[0]);
  EXPECT_EQ(rows.NextVictim(), slots[0]);
}

TEST(CachedRowsTest, CompactKeepsEveryRowAndReleasesMemory) {
  CachedRows rows(16);
  for (uint64_t k = 0; k < 20000; ++k) {
    const uint32_t s = rows.Insert(k * 31);
    rows.row(s)[0] = static_cast<float>(k);
    rows.header(s).meta.update_count = static_cast<uint32_t>(k);
  }
  const uint64_t before = rows.MemoryBytes();
  for (uint64_t k = 0; k < 20000; ++k) {
    if (k % 5 != 0) rows.Erase(rows.Find(k * 31));
  }
  EXPECT_TRUE(rows.Compact());
  EXPECT_LT(rows.MemoryBytes(), before / 3);
  ASSERT_EQ(rows.size(), 4000u);
  for (uint64_t k = 0; k < 20000; k += 5) {
    const uint32_t s = rows.Find(k * 31);
    ASSERT_NE(s, CachedRows::kNoSlot) << k;
    EXPECT_EQ(rows.row(s)[0], static_cast<float>(k));
    EXPECT_EQ(rows.header(s).meta.update_count, k);
  }
  // Slots are reusable after compaction.
  for (uint64_t k = 1; k < 1000; k += 5) rows.Insert(k * 31);
  EXPECT_EQ(rows.size(), 4200u);
}

TEST(CachedRowsTest, MemoryPerRowIsCloseToTheRowBytes) {
  // dim 16 + Adagrad state: 32 floats = 128 raw bytes per row.
  CachedRows rows(32);
  for (uint64_t k = 0; k < 100000; ++k) rows.Insert(k * 0x9e3779b97f4a7c15ULL);
  const double per_row = static_cast<double>(rows.MemoryBytes()) / rows.size();
  EXPECT_LE(per_row, 1.5 * 128) << per_row;
}

}  // namespace
}  // namespace tessera::internal
