// The plans of tessera-ctl scale (scale_plan.cc): the slots moved and, for a replicated
// map, the backups after the move.
#include <gtest/gtest.h>

#include <map>

#include "ps/control/scale_internal.h"
#include "ps/coord/cluster_map.h"

namespace tessera::internal {
namespace {

std::vector<MapServer> ServersOf(int n) {
  std::vector<MapServer> s;
  for (int i = 0; i < n; ++i) {
    s.push_back({"server-" + std::to_string(i), "tcp://127.0.0.1:" + std::to_string(7000 + i)});
  }
  return s;
}

std::vector<uint16_t> PrimariesAfter(const ClusterMap& m, const std::vector<uint16_t>& targets) {
  std::vector<uint16_t> primary = m.primary;
  for (const auto& [slot, to] : PlanMoves(m, targets)) primary[slot] = to;
  return primary;
}

// Every slot backed up by a target other than its primary, each target's share within one.
void ExpectBalancedBackups(const std::vector<uint16_t>& primary,
                           const std::vector<uint16_t>& backup,
                           const std::vector<uint16_t>& targets) {
  std::map<uint16_t, uint32_t> count;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_NE(backup[slot], primary[slot]) << "slot " << slot;
    ASSERT_NE(std::find(targets.begin(), targets.end(), backup[slot]), targets.end())
        << "slot " << slot << " backed up by " << backup[slot];
    ++count[backup[slot]];
  }
  for (uint16_t t : targets) {
    EXPECT_LE(count[t], kNumSlots / targets.size() + 1) << "server " << t;
    EXPECT_GE(count[t], kNumSlots / targets.size()) << "server " << t;
  }
}

TEST(PlanBackups, GrowingKeepsTheBackupsItCanAndGivesTheNewServerItsShare) {
  auto m = ClusterMap::Replicated(ServersOf(3), 2);
  ASSERT_TRUE(m.ok());
  m->servers[2].address.clear();  // a map of two (0 and 1) that grows to three
  auto two = ClusterMap::Replicated(ServersOf(2), 2);
  m->primary = two->primary;
  m->backup = two->backup;
  const std::vector<uint16_t> targets = {0, 1, 2};
  const std::vector<uint16_t> primary = PrimariesAfter(*m, targets);
  const std::vector<uint16_t> backup = PlanBackups(*m, primary, targets);
  ExpectBalancedBackups(primary, backup, targets);
  // Slots whose primary stayed and whose backup stays a target keep most of their backups: a
  // third of the slots at most change backup beyond the moved ones.
  uint32_t kept = 0;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) kept += backup[slot] == m->backup[slot];
  EXPECT_GE(kept, kNumSlots / 2) << "backups changed needlessly";
}

TEST(PlanBackups, ShrinkingMovesBackupsOffTheRetiredServerAndNeverOntoThePrimary) {
  auto m = ClusterMap::Replicated(ServersOf(3), 2);
  ASSERT_TRUE(m.ok());
  const std::vector<uint16_t> targets = {0, 1};
  const std::vector<uint16_t> primary = PrimariesAfter(*m, targets);
  const std::vector<uint16_t> backup = PlanBackups(*m, primary, targets);
  ExpectBalancedBackups(primary, backup, targets);
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    EXPECT_EQ(backup[slot], 1 - primary[slot]) << "slot " << slot;  // two servers: the other
  }
}

TEST(PlanBackups, AnUnchangedClusterChangesNothingAndOneTargetBacksUpNothing) {
  auto m = ClusterMap::Replicated(ServersOf(4), 2);
  ASSERT_TRUE(m.ok());
  const std::vector<uint16_t> targets = {0, 1, 2, 3};
  EXPECT_TRUE(PlanMoves(*m, targets).empty());
  EXPECT_EQ(PlanBackups(*m, m->primary, targets), m->backup);
  // Slots that lost their backup (a fail-over not rebuilt) get one.
  ClusterMap lost = *m;
  for (uint32_t slot = 0; slot < kNumSlots; slot += 3) lost.backup[slot] = ClusterMap::kNoServer;
  ExpectBalancedBackups(lost.primary, PlanBackups(lost, lost.primary, targets), targets);
  const std::vector<uint16_t> one(kNumSlots, 0);
  const std::vector<uint16_t> none = PlanBackups(*m, one, {0});
  EXPECT_EQ(none, std::vector<uint16_t>(kNumSlots, ClusterMap::kNoServer));
}

TEST(Replicated, BackupsOrADenseBackupListMakeAMapReplicated) {
  auto plain = ClusterMap::Uniform(ServersOf(2));
  EXPECT_FALSE(Replicated(plain));
  auto r = ClusterMap::Replicated(ServersOf(2), 2);
  EXPECT_TRUE(Replicated(*r));
  r->backup.assign(kNumSlots, ClusterMap::kNoServer);  // every backup lost: still replicated
  EXPECT_TRUE(Replicated(*r));
}

TEST(PlanDense, ADrainedServersPartsGoToTheirBackupOrTheLeastLoadedAndGrowingSpreadsThem) {
  // Unreplicated, parts on 0, 1, 2: draining 2 sends its part to 0 (a tie, the lowest id).
  const ClusterMap plain = ClusterMap::Uniform(ServersOf(3));
  EXPECT_EQ(PlanDense(plain, {0, 1, 2}), (std::vector<uint16_t>{0, 1, 2}));  // nothing moves
  EXPECT_EQ(PlanDense(plain, {0, 1}), (std::vector<uint16_t>{0, 1, 0}));
  EXPECT_EQ(PlanDense(plain, {1}), (std::vector<uint16_t>{1, 1, 1}));
  // Grown back to three: one of server 0's two parts goes to 2 (the highest-numbered).
  ClusterMap shrunk = plain;
  shrunk.dense_primary = {0, 1, 0};
  EXPECT_EQ(PlanDense(shrunk, {0, 1, 2}), (std::vector<uint16_t>{0, 1, 2}));
  // Two parts (a map of two) over three servers: already within one of each other.
  EXPECT_EQ(PlanDense(ClusterMap::Uniform(ServersOf(2)), {0, 1, 2}),
            (std::vector<uint16_t>{0, 1}));
  // Replicated (part p backed up by p + 1): draining 2 sends part 2 to its backup 0; draining
  // 1 and 2 leaves everything on 0; growing 1 -> 3 prefers parts the receiver backs up.
  auto r = ClusterMap::Replicated(ServersOf(3), 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(PlanDense(*r, {0, 1}), (std::vector<uint16_t>{0, 1, 0}));
  r->dense_primary = {1, 1, 1};
  r->dense_backup = {2, 0, 2};
  EXPECT_EQ(PlanDense(*r, {1, 2}), (std::vector<uint16_t>{2, 1, 1}));
  const std::vector<uint16_t> three = PlanDense(*r, {0, 1, 2});
  std::map<uint16_t, int> count;
  for (uint16_t s : three) ++count[s];
  EXPECT_EQ(count, (std::map<uint16_t, int>{{0, 1}, {1, 1}, {2, 1}}));
  EXPECT_EQ(three[1], 0);  // backed up by 0
}

}  // namespace
}  // namespace tessera::internal
