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

// A replicated map of n servers (backup = primary + 1 mod n) whose dense tables have `dense`
// parts (part p on server p, backup (p + 1) mod n).
ClusterMap Replicated(uint32_t n, uint32_t dense = 1) {
  auto m = ClusterMap::Replicated(Servers(n), 2);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  m->dense_servers = dense;
  m->dense_primary.resize(dense);
  m->dense_backup.resize(dense);
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
  // Dense part p: primary p, backup the next server.
  EXPECT_EQ(m->dense_primary, (std::vector<uint16_t>{0, 1, 2}));
  EXPECT_EQ(m->dense_backup, (std::vector<uint16_t>{1, 2, 0}));
  EXPECT_EQ(*ClusterMap::Replicated(Servers(3), 1), ClusterMap::Uniform(Servers(3)));
  EXPECT_TRUE(ClusterMap::Replicated(Servers(3), 1)->dense_primary.empty());
  EXPECT_TRUE(ClusterMap::Replicated(Servers(3), 1)->dense_backup.empty());
  EXPECT_EQ(ClusterMap::Replicated(Servers(1), 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterMap::Replicated(Servers(3), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterMap::Replicated(Servers(3), 3).status().code(), StatusCode::kInvalidArgument);
  // Two servers back each other up.
  auto two = ClusterMap::Replicated(Servers(2), 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->backup[0], 1);
  EXPECT_EQ(two->backup[kNumSlots - 1], 0);
  EXPECT_EQ(two->dense_backup, (std::vector<uint16_t>{1, 0}));
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
  EXPECT_EQ(v2.servers[1].address, "");  // retired: named nowhere (dense backup cleared)
  EXPECT_EQ(v2.dense_primary, std::vector<uint16_t>{0});
  EXPECT_EQ(v2.dense_backup, std::vector<uint16_t>{kNone});
  EXPECT_EQ(p->dense_backups_cleared, 1u);
  EXPECT_TRUE(p->dense_promoted.empty());
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

TEST(PromoteBackups, ADeadDensePrimarysPartGoesToItsBackupAndItIsRetired) {
  // Three dense parts (0 on 0 backed by 1, 1 on 1 by 2, 2 on 2 by 0). Server 0 dies: part 0
  // goes to server 1, part 2 loses its backup, and nothing names server 0 any more.
  const ClusterMap v1 = Replicated(3, /*dense=*/3);
  auto p = PromoteBackups(v1, {0});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->changed);
  EXPECT_EQ(p->map.dense_primary, (std::vector<uint16_t>{1, 1, 2}));
  EXPECT_EQ(p->map.dense_backup, (std::vector<uint16_t>{kNone, 2, kNone}));
  EXPECT_EQ((p->dense_promoted), (std::map<std::pair<uint16_t, uint16_t>, uint32_t>{{{0, 1}, 1}}));
  EXPECT_EQ(p->dense_parts_promoted(), 1u);
  EXPECT_EQ(p->dense_backups_cleared, 1u);
  EXPECT_TRUE(p->dense_unavailable.empty());
  EXPECT_EQ(p->map.servers[0].address, "");
  EXPECT_EQ(p->retired, std::vector<uint16_t>{0});
  EXPECT_EQ(p->map.dense_servers, 3u);
  EXPECT_TRUE(p->map.Validate().ok()) << p->map.Validate().ToString();
  EXPECT_TRUE(EncodeClusterMap(p->map).ok());

  // Backups without dense_primary (part p on server p): the promotion fills it in.
  ClusterMap implicit = v1;
  implicit.dense_primary.clear();
  ASSERT_TRUE(implicit.Validate().ok()) << implicit.Validate().ToString();
  auto q = PromoteBackups(implicit, {0});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->map.dense_primary, (std::vector<uint16_t>{1, 1, 2}));
  EXPECT_EQ(q->map.dense_backup, (std::vector<uint16_t>{kNone, 2, kNone}));
  EXPECT_EQ(q->retired, std::vector<uint16_t>{0});
}

TEST(PromoteBackups, ADeadServerOfAnUnreplicatedDensePartStaysInTheMap) {
  // Slots replicated, dense tables not (no dense_primary: part p on server p, dense_servers 2).
  // Server 0 dies: its slots go to server 1, but nobody else has dense part 0, so server 0
  // stays in the map (part 0 unavailable until it comes back).
  ClusterMap v1 = Replicated(3, /*dense=*/2);
  v1.dense_primary.clear();
  v1.dense_backup.clear();
  auto p = PromoteBackups(v1, {0});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(p->changed);
  EXPECT_EQ(Count(p->map.primary, 0) + Count(p->map.backup, 0), 0u);
  EXPECT_EQ(p->map.servers[0].address, v1.servers[0].address);  // named by dense part 0
  EXPECT_TRUE(p->retired.empty());
  EXPECT_EQ(p->dense_unavailable, (std::map<uint16_t, uint32_t>{{0, 1}}));
  EXPECT_TRUE(p->dense_promoted.empty());
  EXPECT_TRUE(p->map.dense_primary.empty());  // no backup to move them to
  EXPECT_TRUE(p->map.dense_backup.empty());
  EXPECT_TRUE(p->map.Validate().ok()) << p->map.Validate().ToString();
  // Seen dead again (another watcher, the next poll): nothing more to do.
  auto again = PromoteBackups(p->map, {0});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->changed);
  EXPECT_EQ(again->dense_unavailable, (std::map<uint16_t, uint32_t>{{0, 1}}));
}

TEST(PromoteBackups, ADeadDenseBackupIsCleared) {
  // Dense parts 0 (on 0, backup 1) and 1 (on 1, backup 2). Server 2 dies: part 1 loses its
  // backup, no part moves; server 2 is named nowhere any more and is retired.
  const ClusterMap v1 = Replicated(3, /*dense=*/2);
  auto p = PromoteBackups(v1, {2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->map.dense_primary, (std::vector<uint16_t>{0, 1}));
  EXPECT_EQ(p->map.dense_backup, (std::vector<uint16_t>{1, kNone}));
  EXPECT_EQ(p->dense_backups_cleared, 1u);
  EXPECT_TRUE(p->dense_promoted.empty());
  EXPECT_TRUE(p->dense_unavailable.empty());
  EXPECT_EQ(p->retired, std::vector<uint16_t>{2});
  EXPECT_TRUE(p->map.Validate().ok()) << p->map.Validate().ToString();
}

TEST(PromoteBackups, ADensePartWithBothCopiesDeadKeepsItsPrimary) {
  // Servers 1 and 2 die: part 1 (on 1, backup 2) has no live copy and stays on 1; part 2 (on
  // 2, backup 0) goes to 0; part 0 (on 0, backup 1) loses its backup.
  const ClusterMap v1 = Replicated(3, /*dense=*/3);
  auto p = PromoteBackups(v1, {1, 2});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->map.dense_primary, (std::vector<uint16_t>{0, 1, 0}));
  EXPECT_EQ(p->map.dense_backup, (std::vector<uint16_t>{kNone, kNone, kNone}));
  EXPECT_EQ(p->dense_unavailable, (std::map<uint16_t, uint32_t>{{1, 1}}));
  EXPECT_EQ((p->dense_promoted), (std::map<std::pair<uint16_t, uint16_t>, uint32_t>{{{2, 0}, 1}}));
  EXPECT_EQ(p->dense_backups_cleared, 2u);  // parts 0 and 1
  EXPECT_EQ(p->retired, std::vector<uint16_t>{2});
  EXPECT_TRUE(p->map.Validate().ok()) << p->map.Validate().ToString();
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
  EXPECT_EQ(kept->dense_unavailable.at(0), 1u);
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

// A backup rebuild (importing = the primary): a dead backup being filled ends the fill (backup
// and importing cleared); a dead primary whose backup is not filled yet is not promoted.
TEST(PromoteBackups, ABackupBeingFilledIsNeverPromotedAndItsDeathEndsTheFill) {
  ClusterMap v1 = Replicated(3);
  // Slots of server 0 backed by 1 are being filled on 2 instead.
  std::vector<uint32_t> filling;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (v1.primary[slot] != 0) continue;
    v1.backup[slot] = 2;
    v1.importing[slot] = 0;
    filling.push_back(slot);
  }
  ASSERT_TRUE(v1.Validate().ok()) << v1.Validate().ToString();
  auto backup_dead = PromoteBackups(v1, {2});
  ASSERT_TRUE(backup_dead.ok()) << backup_dead.status().ToString();
  for (uint32_t slot : filling) {
    ASSERT_EQ(backup_dead->map.primary[slot], 0);
    ASSERT_EQ(backup_dead->map.backup[slot], kNone);
    ASSERT_EQ(backup_dead->map.importing[slot], kNone);
  }
  EXPECT_TRUE(backup_dead->map.Validate().ok());
  auto primary_dead = PromoteBackups(v1, {0});
  ASSERT_TRUE(primary_dead.ok()) << primary_dead.status().ToString();
  EXPECT_EQ(primary_dead->importing_untouched, filling.size());
  for (uint32_t slot : filling) {
    ASSERT_EQ(primary_dead->map.primary[slot], 0);
    ASSERT_EQ(primary_dead->map.backup[slot], 2);
  }
}

TEST(PromoteBackups, ADensePartBeingMovedIsLeftAloneAndItsSourceKept) {
  // Part 2 moves from server 2 to 0 (its old backup), with no backup meanwhile.
  ClusterMap v1 = Replicated(3, /*dense=*/3);
  v1.dense_primary[2] = 0;
  v1.dense_backup[2] = kNone;
  v1.dense_importing = {kNone, kNone, 2};
  ASSERT_TRUE(v1.Validate().ok()) << v1.Validate().ToString();
  // The source dies: the move stays (the next scale finishes or reports it), and server 2,
  // still named by it, is not retired although nothing else names it after the promotion.
  auto source_dead = PromoteBackups(v1, {2});
  ASSERT_TRUE(source_dead.ok()) << source_dead.status().ToString();
  EXPECT_EQ(source_dead->map.dense_importing, (std::vector<uint16_t>{kNone, kNone, 2}));
  EXPECT_EQ(source_dead->map.dense_primary, (std::vector<uint16_t>{0, 1, 0}));
  EXPECT_TRUE(source_dead->retired.empty());
  EXPECT_FALSE(source_dead->map.servers[2].address.empty());
  EXPECT_TRUE(source_dead->map.Validate().ok()) << source_dead->map.Validate().ToString();
  // The new primary dies: not promoted anywhere (it holds no complete copy yet); its other
  // part (0, backed up by 1) goes to 1; part 1 (on 1, backup 2) is unchanged.
  auto target_dead = PromoteBackups(v1, {0});
  ASSERT_TRUE(target_dead.ok()) << target_dead.status().ToString();
  EXPECT_EQ(target_dead->map.dense_primary, (std::vector<uint16_t>{1, 1, 0}));
  EXPECT_EQ(target_dead->map.dense_importing, (std::vector<uint16_t>{kNone, kNone, 2}));
  EXPECT_EQ(target_dead->map.dense_backup, (std::vector<uint16_t>{kNone, 2, kNone}));
  EXPECT_EQ(target_dead->dense_unavailable, (std::map<uint16_t, uint32_t>{{0, 1}}));
  EXPECT_TRUE(target_dead->map.Validate().ok()) << target_dead->map.Validate().ToString();
}

// What a controller whose swap lost to a fail-over is told: the promotion, the retirement and
// the backups lost, in words; a rebuild's backups; nothing for the same map.
TEST(DescribeMapChange, NamesAFailOverAndARebuild) {
  const ClusterMap before = Replicated(3);
  auto p = PromoteBackups(before, {1});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string what = DescribeMapChange(before, p->map);
  EXPECT_NE(what.find("5461 slots of server 1 were failed over to their backups (a fail-over: "
                      "server 1 died)"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("server 1 (server-1) was retired"), std::string::npos) << what;
  EXPECT_NE(what.find("5462 slots lost their backup"), std::string::npos) << what;  // server 0's
  EXPECT_EQ(what.find("a scale"), std::string::npos) << what;
  EXPECT_EQ(DescribeMapChange(before, before), "");
  ClusterMap rebuilt = p->map;
  for (uint32_t slot = 0; slot < 10; ++slot) {
    if (rebuilt.backup[slot] == kNone) rebuilt.backup[slot] = rebuilt.primary[slot] == 0 ? 2 : 0;
  }
  EXPECT_NE(DescribeMapChange(p->map, rebuilt).find("slots were given a backup (a rebuild)"),
            std::string::npos)
      << DescribeMapChange(p->map, rebuilt);
}

TEST(PromoteBackups, RefusesABadMapOrAnUnknownServer) {
  EXPECT_EQ(PromoteBackups(Replicated(3), {3}).status().code(), StatusCode::kInvalidArgument);
  ClusterMap broken = Replicated(3);
  broken.backup[5] = broken.primary[5];
  EXPECT_EQ(PromoteBackups(broken, {1}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
