#include <gtest/gtest.h>

#include <map>
#include <vector>
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
      for (int j = 0; j < 5; ++j) rows.mutable_row(s)[j] = static_cast<float>(key) + j;
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
  rows.MarkDirty(slots[0]);
  uint32_t v = rows.NextVictim();
  ASSERT_NE(v, CachedRows::kNoSlot);
  EXPECT_EQ(rows.header(v).key, 1u);  // row 0 is pinned
  rows.Erase(v);
  rows.flags(slots[2]) |= CachedRows::kReferenced;  // used again: survives this turn
  v = rows.NextVictim();
  EXPECT_EQ(rows.header(v).key, 3u);
  rows.Erase(v);
  v = rows.NextVictim();
  EXPECT_EQ(rows.header(v).key, 2u);
  rows.Erase(v);
  EXPECT_EQ(rows.NextVictim(), CachedRows::kNoSlot);  // only the pinned row is left
  rows.BeginFlight();
  EXPECT_EQ(rows.NextVictim(), CachedRows::kNoSlot);  // in flight: still pinned
  rows.EndFlight();
  EXPECT_EQ(rows.NextVictim(), slots[0]);
}

TEST(CachedRowsTest, WriteBackGenerationsTrackDirtyAndInFlightRows) {
  CachedRows rows(1);
  std::vector<uint32_t> s;
  for (uint64_t k = 0; k < 4; ++k) s.push_back(rows.Insert(k));
  EXPECT_TRUE(rows.MarkDirty(s[0]));
  EXPECT_FALSE(rows.MarkDirty(s[0]));  // listed once
  EXPECT_TRUE(rows.MarkDirty(s[1]));
  EXPECT_EQ(rows.unpinned(), 2u);
  rows.BeginFlight();
  EXPECT_FALSE(rows.dirty(s[0]));
  EXPECT_TRUE(rows.pinned(s[0]));
  EXPECT_EQ(rows.dirty_rows(), 0u);
  EXPECT_TRUE(rows.MarkDirty(s[1]));  // changed again while in flight: dirty, listed again
  EXPECT_TRUE(rows.MarkDirty(s[2]));
  EXPECT_EQ(rows.unpinned(), 1u);
  rows.EndFlight();
  EXPECT_FALSE(rows.pinned(s[0]));
  EXPECT_TRUE(rows.pinned(s[1]));
  EXPECT_TRUE(rows.dirty(s[1]));
  EXPECT_EQ(rows.unpinned(), 2u);
  // A failed flight: its rows are marked dirty again before it ends.
  rows.BeginFlight();
  for (uint32_t slot : {s[1], s[2]}) EXPECT_TRUE(rows.MarkDirty(slot));
  rows.EndFlight();
  EXPECT_TRUE(rows.dirty(s[1]) && rows.dirty(s[2]));
  EXPECT_EQ(rows.unpinned(), 2u);
  rows.Erase(s[1]);  // counts follow an erased pinned row
  EXPECT_EQ(rows.dirty_rows(), 1u);
  EXPECT_EQ(rows.unpinned(), 2u);
}

TEST(CachedRowsTest, CompactKeepsEveryRowAndReleasesMemory) {
  CachedRows rows(16);
  for (uint64_t k = 0; k < 20000; ++k) {
    const uint32_t s = rows.Insert(k * 31);
    rows.mutable_row(s)[0] = static_cast<float>(k);
    rows.mutable_meta(s).update_count = static_cast<uint32_t>(k);
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

TEST(CachedRowsTest, FrozenKeepsRowsAsTheyWereWhileTheOwnerChangesEvictsAndCompacts) {
  CachedRows rows(4);
  std::vector<uint32_t> slots;
  for (uint64_t k = 0; k < 5000; ++k) {
    const uint32_t s = rows.Insert(k);
    for (int j = 0; j < 4; ++j) rows.mutable_row(s)[j] = static_cast<float>(k) + j;
    rows.mutable_meta(s).update_count = static_cast<uint32_t>(k);
    slots.push_back(s);
  }
  const CachedRows::Frozen frozen = rows.Freeze();
  // Every kind of change after the freeze: rows and metas changed, flags flipped, rows evicted
  // and their slots reused by other keys, then the arena compacted.
  for (uint64_t k = 0; k < 5000; k += 2) {
    rows.mutable_row(slots[k])[0] = -1;
    rows.mutable_meta(slots[k]).update_count = 0;
    rows.flags(slots[k]) |= CachedRows::kReferenced;
  }
  for (uint64_t k = 1; k < 5000; k += 4) rows.Erase(slots[k]);
  for (uint64_t k = 0; k < 600; ++k) rows.Insert(100000 + k);
  for (uint64_t k = 3; k < 5000; k += 4) rows.Erase(rows.Find(k));
  rows.Compact();
  EXPECT_GT(rows.copied_blocks(), 0u);
  for (uint64_t k = 0; k < 5000; ++k) {
    ASSERT_EQ(frozen.key(slots[k]), k);
    ASSERT_EQ(frozen.meta(slots[k]).update_count, k);
    for (int j = 0; j < 4; ++j) ASSERT_EQ(frozen.row(slots[k])[j], static_cast<float>(k) + j) << k;
  }
  // The owner sees its own changes.
  EXPECT_EQ(rows.row(rows.Find(0))[0], -1);
  EXPECT_EQ(rows.Find(1), CachedRows::kNoSlot);
  EXPECT_EQ(rows.header(rows.Find(100000)).key, 100000u);
}

TEST(CachedRowsTest, BlocksAreCopiedOnlyWhileAFrozenHoldsThem) {
  CachedRows rows(4);
  for (uint64_t k = 0; k < 1000; ++k) rows.Insert(k);
  {
    const CachedRows::Frozen frozen = rows.Freeze();
    rows.mutable_row(rows.Find(7))[0] = 1;
    rows.mutable_row(rows.Find(7))[1] = 2;  // its block is already this arena's own
    EXPECT_EQ(rows.copied_blocks(), 1u);
  }
  rows.Freeze();  // let go at once: nothing to copy
  rows.mutable_row(rows.Find(8))[0] = 1;
  rows.mutable_row(rows.Find(900))[0] = 1;
  rows.flags(rows.Find(901)) |= CachedRows::kReferenced;
  EXPECT_EQ(rows.copied_blocks(), 1u);
}

TEST(CachedRowsTest, VisitAndReleaseVisitsEachSlotOnceAndGivesTheBlocksBack) {
  CachedRows rows(2);
  std::vector<uint32_t> all;
  for (uint64_t k = 0; k < 3000; ++k) {
    all.push_back(rows.Insert(k));
    rows.mutable_row(all.back())[0] = static_cast<float>(k);
  }
  CachedRows::Frozen frozen = rows.Freeze();
  std::vector<uint32_t> slots = {all[2999], all[5], all[1000], all[5], all[0]};
  std::vector<uint64_t> seen;
  frozen.VisitAndRelease(slots, [&](uint32_t slot) {
    EXPECT_EQ(frozen.row(slot)[0], static_cast<float>(frozen.key(slot)));
    seen.push_back(frozen.key(slot));
  });
  EXPECT_EQ(seen, (std::vector<uint64_t>{0, 5, 1000, 2999}));  // arena order, once each
  EXPECT_TRUE(frozen.empty());
  for (uint32_t s : all) rows.mutable_row(s)[1] = 1;
  EXPECT_EQ(rows.copied_blocks(), 0u);  // nothing left shared
}

// FindEach gives each key of a batch its slot as Find does: keys present, absent, repeated,
// and keys whose index tags and home entries collide (a slot found from the index alone that
// holds another key), in batches shorter and longer than the pipeline.
TEST(CachedRowsTest, FindEachAgreesWithFindOnCollidingRepeatedAndAbsentKeys) {
  CachedRows rows(4, /*index_seed=*/0);
  // Hashes (seed 0) equal in the low 20 and the top 32 bits: same home entry, same tag.
  std::vector<uint64_t> colliding;
  for (uint64_t j = 1; j <= 6; ++j) colliding.push_back(Unmix64(0x5a5a5a5a'00000123ull | j << 20));
  std::mt19937_64 rng(5);
  std::vector<uint64_t> present;
  for (int i = 0; i < 3000; ++i) present.push_back(rng());
  for (size_t j = 0; j < colliding.size(); j += 2) present.push_back(colliding[j]);  // 1, 3, 5
  for (uint64_t k : present) rows.Insert(k);
  for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{12}, size_t{40}, size_t{5000}}) {
    std::vector<uint64_t> batch;
    for (size_t i = 0; i < n; ++i) {
      switch (rng() % 4) {
        case 0:
          batch.push_back(rng());
          break;  // absent
        case 1:
          batch.push_back(colliding[rng() % colliding.size()]);
          break;
        case 2:
          batch.push_back(batch.empty() ? present[0] : batch[rng() % batch.size()]);
          break;
        default:
          batch.push_back(present[rng() % present.size()]);
      }
    }
    size_t calls = 0, ahead = 0;
    rows.FindEach(
        batch, [&](uint64_t) { ++ahead; },
        [&](size_t i, uint32_t slot) {
          ASSERT_EQ(i, calls++);
          ASSERT_EQ(slot, rows.Find(batch[i])) << "key " << batch[i] << " at " << i;
          if (slot != CachedRows::kNoSlot) {
            ASSERT_EQ(rows.header(slot).key, batch[i]);
          }
        });
    EXPECT_EQ(calls, n);
    EXPECT_EQ(ahead, n);
  }
  // The colliding keys present are found, the others not.
  for (size_t j = 0; j < colliding.size(); ++j) {
    const uint32_t slot = rows.Find(colliding[j]);
    EXPECT_EQ(slot != CachedRows::kNoSlot, j % 2 == 0) << j;
  }
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
