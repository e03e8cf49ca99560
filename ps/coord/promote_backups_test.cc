// PromoteBackups (ps/coord/failover.h) and ClusterMap::Replicated: the fail-over step on a map,
// without etcd.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "ps/coord/cluster_map.h"
#include "ps/coord/failover.h"

namespace tessera {
namespace {

constexpr uint16_t kNone = ClusterMap::kNoServer;

std::vector<MapServer> Servers(uint32_t n) {
  std::vector<MapServer> s;
  for (uint32_t i = 0; i < n; ++i) {
    s.push_back({"server-" + std::to_string(i), "tcp://127.0.0.1:" + std::to_string(7000 + i)});
  }
  return s;
}

// A replicated map of n servers (backup = primary + 1 mod n) whose dense tables are on
// `dense` servers.
ClusterMap Replicated(uint32_t n, uint32_t dense = 1) {
  auto m = ClusterMap::Replicated(Servers(n), 2);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  m->dense_servers = dense;
  return *m;
}

uint32_t Count(const std::vector<uint16_t>& ids, uint16_t id) {
  return static_cast<uint32_t>(std::count(ids.begin(), ids.end(), id));
}

TEST(ClusterMapReplicated, BackupIsTheNextServerAndBadReplicationIsRefused) {
  auto m = ClusterMap::Replicated(Servers(3), 2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->Validate().ok());
  EXPECT_EQ(m->version, 1u);
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_EQ(m->backup[slot], (m->primary[slot] + 1) % 3) << slot;
  }
  EXPECT_EQ(*ClusterMap::Replicated(Servers(3), 1), ClusterMap::Uniform(Servers(3)));
  EXPECT_EQ(ClusterMap::Replicated(Servers(1), 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterMap::Replicated(Servers(3), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterMap::Replicated(Servers(3), 3).status().code(), StatusCode::kInvalidArgument);
  // Two servers back each other up.
  auto two = ClusterMap::Replicated(Servers(2), 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->backup[0], 1);
  EXPECT_EQ(two->backup[kNumSlots - 1], 0);
}

TEST(PromoteBackups, DeadPrimarysSlotsGoToTheirBackupAndItIsRetired) {
  const ClusterMap v1 = Replicated(3);
  const uint32_t of1 = Count(v1.primary, 1), backed_by_1 = Count(v1.backup, 1);
  auto p = PromoteBackups(v1, {1});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->changed);
  const ClusterMap& v2 = p->map;
  EXPECT_TRUE(v2.Validate().ok()) << v2.Validate().ToString();
  EXPECT_EQ(v2.version, 2u);
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (v1.primary[slot] == 1) {
      EXPECT_EQ(v2.primary[slot], 2) << slot;  // its backup
      EXPECT_EQ(v2.backup[slot], kNone) << slot;
    } else if (v1.backup[slot] == 1) {
      EXPECT_EQ(v2.primary[slot], v1.primary[slot]) << slot;  // server 0's slots: kept
      EXPECT_EQ(v2.backup[slot], kNone) << slot;              // dead backup cleared
    } else {
      EXPECT_EQ(v2.primary[slot], v1.primary[slot]) << slot;  // server 2's: untouched
      EXPECT_EQ(v2.backup[slot], v1.backup[slot]) << slot;
    }
  }
  EXPECT_EQ(Count(v2.primary, 1) + Count(v2.backup, 1), 0u);
  EXPECT_EQ(v2.servers[1].address, "");  // retired: named nowhere, not a dense server
  EXPECT_EQ(v2.servers[1].id, "server-1");
  EXPECT_EQ(v2.servers[0], v1.servers[0]);
  EXPECT_EQ(v2.servers[2], v1.servers[2]);
  EXPECT_EQ((p->promoted), (std::map<std::pair<uint16_t, uint16_t>, uint32_t>{{{1, 2}, of1}}));
  EXPECT_EQ(p->slots_promoted(), of1);
  EXPECT_EQ(p->backups_cleared, backed_by_1);
  EXPECT_EQ(p->retired, std::vector<uint16_t>{1});
  EXPECT_TRUE(p->unavailable.empty());
  // The record of the next map encodes (the store would take it).
  EXPECT_TRUE(EncodeClusterMap(v2).ok());
}

TEST(PromoteBackups, ADeadBackupIsCleared) {
  // Server 2 dies: the slots it backs up (server 1's) lose their backup; its own slots go to
  // server 0.
  const ClusterMap v1 = Replicated(3);
  auto p = PromoteBackups(v1, {2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (v1.primary[slot] == 1) {
      EXPECT_EQ(p->map.primary[slot], 1) << slot;
      EXPECT_EQ(p->map.backup[slot], kNone) << slot;
    }
  }
  EXPECT_EQ(p->backups_cleared, Count(v1.primary, 1));
  EXPECT_EQ(p->slots_promoted(), Count(v1.primary, 2));
}

TEST(PromoteBackups, BothDeadKeepsThePrimaryAndReportsTheSlotsUnavailable) {
  // Servers 1 and 2 die: server 1's slots (backup 2) have no live copy; server 2's go to 0.
  const ClusterMap v1 = Replicated(3);
  auto p = PromoteBackups(v1, {1, 2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->map.Validate().ok());
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (v1.primary[slot] == 1) {
      EXPECT_EQ(p->map.primary[slot], 1) << slot;  // kept: nobody else has its rows
      EXPECT_EQ(p->map.backup[slot], kNone) << slot;
    } else {
      EXPECT_EQ(p->map.primary[slot], 0) << slot;
    }
  }
  EXPECT_EQ(p->unavailable, (std::map<uint16_t, uint32_t>{{1, Count(v1.primary, 1)}}));
  EXPECT_EQ(p->map.servers[1].address, v1.servers[1].address);  // still named: not retired
  EXPECT_EQ(p->map.servers[2].address, "");                      // named nowhere: retired
  EXPECT_EQ(p->retired, std::vector<uint16_t>{2});
}

TEST(PromoteBackups, ADeadDenseServerIsRetiredOnceNoSlotNamesIt) {
  // Server 0 holds dense tables (dense_servers 2 here: servers 0 and 1); its slots go to 1,
  // and it is retired like any dead server (dense tables are not replicated: clients fail its
  // dense ranges at once, naming it, instead of waiting for it).
  const ClusterMap v1 = Replicated(3, /*dense=*/2);
  auto p = PromoteBackups(v1, {0});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->changed);
  EXPECT_EQ(Count(p->map.primary, 0) + Count(p->map.backup, 0), 0u);
  EXPECT_EQ(p->map.servers[0].address, "");
  EXPECT_EQ(p->retired, std::vector<uint16_t>{0});
  EXPECT_EQ(p->map.dense_servers, 2u);  // dense tables do not move
  EXPECT_TRUE(p->map.Validate().ok());
}

TEST(PromoteBackups, NothingDeadOrNothingToDoReturnsTheSameMap) {
  const ClusterMap v1 = Replicated(3);
  auto none = PromoteBackups(v1, {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->changed);
  EXPECT_EQ(none->map, v1);
  EXPECT_EQ(none->map.version, 1u);
  // An unreplicated map whose dense server 0 died: its slots have no backup, nothing changes.
  ClusterMap plain = ClusterMap::Uniform(Servers(2));
  auto kept = PromoteBackups(plain, {0});
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->changed);
  EXPECT_EQ(kept->map, plain);
  EXPECT_EQ(kept->unavailable.at(0), Count(plain.primary, 0));
  // Promoting twice: the second finds nothing more to do (a watcher that lost the race).
  auto once = PromoteBackups(v1, {1});
  ASSERT_TRUE(once.ok());
  auto twice = PromoteBackups(once->map, {1});  // server 1 is retired now: ignored
  ASSERT_TRUE(twice.ok());
  EXPECT_FALSE(twice->changed);
  EXPECT_EQ(twice->map, once->map);
}

TEST(PromoteBackups, SlotsBeingMovedAreLeftAlone) {
  ClusterMap v1 = Replicated(3);
  // Slot 0 (primary 0, backup 1) is being moved to server 2 from server 0.
  ASSERT_EQ(v1.primary[0], 0);
  v1.primary[0] = 2;
  v1.backup[0] = 1;
  v1.importing[0] = 0;
  ASSERT_TRUE(v1.Validate().ok()) << v1.Validate().ToString();
  auto p = PromoteBackups(v1, {0});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->importing_untouched, 1u);
  EXPECT_EQ(p->map.primary[0], 2);
  EXPECT_EQ(p->map.backup[0], 1);
  EXPECT_EQ(p->map.importing[0], 0);
  EXPECT_TRUE(p->map.Validate().ok());
}

TEST(PromoteBackups, RefusesABadMapOrAnUnknownServer) {
  EXPECT_EQ(PromoteBackups(Replicated(3), {3}).status().code(), StatusCode::kInvalidArgument);
  ClusterMap broken = Replicated(3);
  broken.backup[5] = broken.primary[5];
  EXPECT_EQ(PromoteBackups(broken, {1}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
