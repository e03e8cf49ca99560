#include <gtest/gtest.h>

#include <thread>

#include "ps/server/map_fence_internal.h"

namespace tessera::internal {
namespace {

// A map of `servers` uniform primaries at `version`.
RoutingMap Map(uint64_t version, uint32_t servers = 2) {
  RoutingMap m;
  m.version = version;
  m.primary = SlotMap::Uniform(servers);
  m.addresses.assign(servers, "tcp://127.0.0.1:1");
  return m;
}

Header Request(uint64_t map_version) {
  Header h;
  h.op = Op::kSparsePush;
  h.map_version = map_version;
  return h;
}

TEST(MapFence, WithoutAMapTheStaticClusterServesAndEveryVersionPasses) {
  MapFence fence(/*rank=*/1, /*num_servers=*/3, /*follow=*/false, SlotMap::Uniform(3));
  EXPECT_EQ(fence.Current(), nullptr);
  EXPECT_EQ(fence.Owners().num_servers(), 3u);
  EXPECT_EQ(fence.DenseServers(), 3u);
  uint64_t mine = 99;
  EXPECT_TRUE(fence.Matches(Request(5), &mine));
  EXPECT_EQ(fence.ReplyVersion(), 0u);
  const Status refused = fence.Set(Map(1));
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("follows no cluster map"), std::string::npos);
}

TEST(MapFence, ANewerMapWinsAndTheIoThreadSeesItOnce) {
  MapFence fence(0, 2, /*follow=*/true, SlotMap::Uniform(2));
  EXPECT_EQ(fence.Current(), nullptr);
  EXPECT_FALSE(fence.TakeChanged());
  EXPECT_EQ(fence.Set(Map(0)).code(), StatusCode::kInvalidArgument);  // the static cluster
  ASSERT_TRUE(fence.Set(Map(3)).ok());
  EXPECT_EQ(fence.version(), 3u);
  const ClusterMapState* m = fence.Current();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->version, 3u);
  EXPECT_EQ(m->dense_servers, 2u);  // a map without dense_servers: every server
  EXPECT_TRUE(fence.TakeChanged());
  EXPECT_FALSE(fence.TakeChanged());
  // An older or equal version is ignored (OK: the watcher may deliver it late).
  EXPECT_TRUE(fence.Set(Map(2, 3)).ok());
  EXPECT_EQ(fence.version(), 3u);
  EXPECT_TRUE(fence.Set(Map(3, 3)).ok());
  EXPECT_EQ(fence.version(), 3u);
  EXPECT_EQ(fence.Current()->version, 3u);
  EXPECT_EQ(fence.Owners().num_servers(), 2u);
  EXPECT_FALSE(fence.TakeChanged());
  // Set from another thread: the I/O thread's next Current() picks it up.
  std::thread([&] { ASSERT_TRUE(fence.Set(Map(4, 3)).ok()); }).join();
  EXPECT_EQ(fence.Current()->version, 4u);
  EXPECT_TRUE(fence.TakeChanged());
  EXPECT_EQ(fence.ReplyVersion(), 4u);
}

// A request ahead of the server is refused ("still at 5"); the watcher sets version 6 before
// the refusal is answered. The reply must carry 5, the version the refusal was decided by: with
// 6, the request's own version, the client took the refusal for one not about the map and
// reported it as final (a dense push's refused part was never sent again while its other parts
// were applied; issue 35 item 14).
TEST(MapFence, ARefusalIsAnsweredWithTheVersionItWasDecidedBy) {
  MapFence fence(4, 2, true, SlotMap::Uniform(2));
  EXPECT_EQ(fence.ReplyVersion(), 0u);
  uint64_t mine = 99;
  EXPECT_FALSE(fence.Matches(Request(5), &mine));  // no map yet
  EXPECT_EQ(mine, 0u);
  ASSERT_TRUE(fence.Set(Map(5)).ok());
  EXPECT_EQ(fence.ReplyVersion(), 0u) << "a refusal decided without a map says 0";
  EXPECT_FALSE(fence.Matches(Request(6), &mine));
  EXPECT_EQ(mine, 5u);
  const Status refused = fence.Refuse(Request(6), mine);
  EXPECT_NE(refused.message().find("is still at 5"), std::string::npos) << refused.ToString();
  std::thread([&] { ASSERT_TRUE(fence.Set(Map(6)).ok()); }).join();
  EXPECT_EQ(fence.version(), 6u);
  EXPECT_EQ(fence.ReplyVersion(), 5u);
  // The next request served by the I/O thread is served by 6, and so are its replies.
  EXPECT_TRUE(fence.Matches(Request(6), &mine));
  EXPECT_EQ(fence.ReplyVersion(), 6u);
}

TEST(MapFence, ARequestOfAnotherVersionIsRefusedNamingBoth) {
  MapFence fence(1, 2, true, SlotMap::Uniform(2));
  ASSERT_TRUE(fence.Set(Map(5)).ok());
  uint64_t mine = 0;
  EXPECT_TRUE(fence.Matches(Request(5), &mine));
  EXPECT_EQ(mine, 5u);
  EXPECT_FALSE(fence.Matches(Request(4), &mine));
  const Status old = fence.Refuse(Request(4), mine);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("request has version 4, server 1 is at 5"), std::string::npos)
      << old.ToString();
  EXPECT_FALSE(fence.Matches(Request(6), &mine));
  const Status ahead = fence.Refuse(Request(6), mine);
  EXPECT_NE(ahead.message().find("is still at 5"), std::string::npos) << ahead.ToString();
  fence.CountRefusal();
  EXPECT_EQ(fence.refusals(), 3u);
}

TEST(MapFence, MarksOnlyTheCopiesThisServerTakesPartIn) {
  // Server 1 is the new primary of slot 0 (moving from 0), the backup being filled of slot 1
  // (its primary 0 copies it), and neither of slot 2, which moves between two others.
  RoutingMap m = Map(2, 3);
  std::vector<uint16_t> owners = m.primary.owners();
  owners[0] = 1;
  owners[1] = 0;
  owners[2] = 2;
  m.primary = *SlotMap::FromOwners(owners, 3);
  m.importing.assign(kNumSlots, RoutingMap::kNotImporting);
  m.importing[0] = 0;
  m.importing[1] = 0;
  m.importing[2] = 0;
  m.backup.assign(kNumSlots, RoutingMap::kNoBackup);
  m.backup[1] = 1;
  MapFence fence(1, 3, true, SlotMap::Uniform(3));
  ASSERT_TRUE(fence.Set(m).ok());
  const ClusterMapState* s = fence.Current();
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(s->importing.size(), kNumSlots);
  EXPECT_TRUE(s->importing[0]);
  EXPECT_FALSE(s->importing[1]);
  EXPECT_FALSE(s->importing[2]);
  ASSERT_EQ(s->filling.size(), kNumSlots);
  EXPECT_TRUE(s->filling[1]);
  EXPECT_FALSE(s->filling[0]);
  ASSERT_EQ(s->moving_from.size(), kNumSlots);
  EXPECT_EQ(s->moving_from[2], 0);
  EXPECT_EQ(s->moving_from[0], RoutingMap::kNoBackup);
  EXPECT_EQ(s->backup[1], 1);
}

TEST(MapFence, AMalformedMapIsRefusedAndTheOldOneStays) {
  MapFence fence(0, 2, true, SlotMap::Uniform(2));
  ASSERT_TRUE(fence.Set(Map(1)).ok());
  RoutingMap bad = Map(2);
  bad.backup.assign(3, 0);  // not one entry a slot
  EXPECT_EQ(fence.Set(bad).code(), StatusCode::kInvalidArgument);
  RoutingMap dense = Map(2);
  dense.dense_primary = {0};  // two dense parts, one primary
  EXPECT_EQ(fence.Set(dense).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fence.version(), 1u);
  EXPECT_EQ(fence.Current()->version, 1u);
}

}  // namespace
}  // namespace tessera::internal
