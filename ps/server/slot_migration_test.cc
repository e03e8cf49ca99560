#include <gtest/gtest.h>

#include "ps/server/slot_migration_internal.h"

namespace tessera::internal {
namespace {

std::shared_ptr<Pending> Request(uint64_t id, std::chrono::steady_clock::time_point at) {
  auto p = std::make_shared<Pending>();
  p->header.request_id = id;
  p->received = at;
  return p;
}

TEST(SlotMigration, MarksSurviveEncodeAndDecodeAndAreForgottenOnceSettled) {
  SlotMigration m(1);
  m.MarkSlotsFilled({3, 7});
  m.GrowDense(4);
  m.MarkDenseFilled({1});
  EXPECT_TRUE(m.slot_filled(3));
  EXPECT_FALSE(m.slot_filled(4));
  EXPECT_TRUE(m.dense_filled(1));
  EXPECT_FALSE(m.dense_filled(2));
  EXPECT_FALSE(m.dense_filled(99));  // past the parts known: not filled
  SlotMigration restarted(2);
  ASSERT_TRUE(restarted.Decode(m.EncodeSlots(), m.EncodeDense()).ok());
  EXPECT_TRUE(restarted.slot_filled(7));
  EXPECT_TRUE(restarted.dense_filled(1));
  EXPECT_EQ(restarted.Decode(std::string("01"), std::nullopt).code(), StatusCode::kCorruption);
  EXPECT_TRUE(SlotMigration(3).Decode(std::nullopt, std::nullopt).ok());

  // A map that still copies slot 3 in (as its new primary) and dense part 1: only slot 7's
  // mark goes.
  ClusterMapState map;
  map.importing.assign(kNumSlots, false);
  map.importing[3] = true;
  map.dense_filling = {false, true, false, false};
  EXPECT_TRUE(m.ForgetSettled(&map));
  EXPECT_TRUE(m.slot_filled(3));
  EXPECT_FALSE(m.slot_filled(7));
  EXPECT_TRUE(m.dense_filled(1));
  EXPECT_FALSE(m.ForgetSettled(&map));  // nothing more to forget
  EXPECT_TRUE(m.ForgetSettled(nullptr));
  EXPECT_FALSE(m.slot_filled(3));
  EXPECT_FALSE(m.dense_filled(1));
}

TEST(SlotMigration, CopyingInCoversAMovesPrimaryAndAFilledBackup) {
  ClusterMapState map;
  EXPECT_FALSE(SlotMigration::CopyingIn(nullptr, 0));
  EXPECT_FALSE(SlotMigration::CopyingIn(&map, 0));
  map.importing.assign(kNumSlots, false);
  map.importing[1] = true;
  map.filling.assign(kNumSlots, false);
  map.filling[2] = true;
  EXPECT_TRUE(SlotMigration::CopyingIn(&map, 1));
  EXPECT_TRUE(SlotMigration::CopyingIn(&map, 2));
  EXPECT_FALSE(SlotMigration::CopyingIn(&map, 3));
}

TEST(SlotMigration, HeldRequestsAreBoundedExpireAndLeaveInArrivalOrder) {
  SlotMigration m(1);
  const auto now = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < SlotMigration::kMaxParked; ++i) {
    ASSERT_TRUE(m.Park(Request(i, now), /*readmitting=*/false));
  }
  EXPECT_FALSE(m.Park(Request(1000000, now), false));  // a new one past the bound
  EXPECT_TRUE(m.Park(Request(1000001, now), true));    // one that waited already
  EXPECT_EQ(m.parked_now(), SlotMigration::kMaxParked + 1);
  EXPECT_EQ(m.parked_total(), SlotMigration::kMaxParked + 1);
  auto all = m.TakeParked();
  ASSERT_EQ(all.size(), SlotMigration::kMaxParked + 1);
  EXPECT_EQ(all.front()->header.request_id, 0u);
  EXPECT_EQ(all.back()->header.request_id, 1000001u);
  EXPECT_EQ(m.parked_now(), 0u);

  const auto old = now - SlotMigration::kHoldLimit;
  ASSERT_TRUE(m.Park(Request(1, old), false));
  ASSERT_TRUE(m.Park(Request(2, now), false));
  ASSERT_TRUE(m.Park(Request(3, old), false));
  auto expired = m.TakeExpired(now);
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0]->header.request_id, 1u);
  EXPECT_EQ(expired[1]->header.request_id, 3u);
  EXPECT_EQ(m.parked_now(), 1u);
}

TEST(SlotMigration, ExportsRunInOrderOnceNoOlderRequestWaits) {
  SlotMigration m(1);
  std::vector<uint64_t> ran;
  m.WaitExport(2, [&] { ran.push_back(2); });
  m.WaitExport(3, [&] { ran.push_back(3); });
  uint64_t oldest_waiting = 2;  // the queue's head was sequenced by map 2
  auto older_waits = [&](uint64_t v) { return oldest_waiting < v; };
  m.RunExports(older_waits);
  EXPECT_EQ(ran, (std::vector<uint64_t>{2}));
  EXPECT_EQ(m.exports_waiting(), 1u);
  oldest_waiting = 3;
  m.RunExports(older_waits);
  EXPECT_EQ(ran, (std::vector<uint64_t>{2, 3}));
  m.NoteMetaWritten("user/a");
  EXPECT_TRUE(m.MetaWritten("user/a"));
  EXPECT_FALSE(m.MetaWritten("user/b"));
}

}  // namespace
}  // namespace tessera::internal
