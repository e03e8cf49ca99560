// Recovery of the replicated tier (docs/elasticity.md, "Backup rebuild"): three real
// tessera-server processes with --coordinator in a real etcd, a map made by `tessera-ctl map
// init --replication=2`.
//  - a background rebuild whose source is killed between two of its batches gives up once the
//    source is no longer registered, frees the controller lock, and the next rebuild gives up
//    the fills of the dead server and backs up every slot whose primary lives;
//  - `tessera-ctl map rebuild` whose swap of the map loses to a fail-over says so (what the
//    fail-over changed, which server is dead) and what to run.
#include <chrono>
#include <cstdio>
#include <thread>

#include "ps/coord/cluster_map.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/replicated_cluster.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/recovery";

// Map version 1 -> 2: the slots whose primary is server 2 lose their backups (a rebuild is due).
void DropBackupsOfServerTwo(SlotMapStore& store) {
  auto m = store.Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ClusterMap stripped = *m;
  stripped.version = 2;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (stripped.primary[slot] == 2) stripped.backup[slot] = ClusterMap::kNoServer;
  }
  ASSERT_TRUE(store.CompareAndSwap(1, stripped).ok());
}

class RecoveryTest : public ReplicatedClusterTest {
 protected:
  // Background rebuilds wait about 50 times as long as each batch took before the next one:
  // a kill lands between two batches.
  RecoveryTest() : ReplicatedClusterTest(kPrefix) { server_flags_ = {"--rebuild_pace=0.02"}; }

  // True when the controller lock is free now (taken and given back at once).
  bool LockIsFree() {
    auto lock = LockController(client_.get(), "/" + std::string(kPrefix), "recovery-test", 5,
                               /*wait=*/false, std::chrono::steady_clock::now());
    return lock.ok();
  }

  // The lease under which the controller lock is held now (0: free, or unreadable).
  int64_t LockLease() {
    auto kv = client_->Get(ControllerKey("/" + std::string(kPrefix)));
    return kv.ok() && kv->has_value() ? (*kv)->lease : 0;
  }
};

TEST_F(RecoveryTest, ARebuildWhoseSourceDiesGivesUpAndFreesTheControllerLock) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(2, 20000);
  ASSERT_TRUE(c->Wait(c->Push(t, keys, std::vector<float>(keys.size() * kDim, 1.0f))).ok());
  // Server 2's slots lose their backups: the lowest live server (0) rebuilds them, copying
  // from server 2 in batches of 1024 slots (version 3 flips the first, version 4 settles it).
  ASSERT_NO_FATAL_FAILURE(DropBackupsOfServerTwo(*store_));
  ASSERT_TRUE(WaitFor(
      [&] {
        auto now = store_->Load();
        return now.ok() && now->version >= 4;
      },
      seconds(60)))
      << "the background rebuild did not start";
  const int64_t running = LockLease();  // the rebuild's
  ASSERT_NE(running, 0) << "the background rebuild holds no controller lock";
  cluster_->Kill(2);
  const auto killed = std::chrono::steady_clock::now();
  // The rebuild's next batch copies from the dead server. It gives up once server 2 is not
  // registered (TTL 2 s) and frees the lock (the next rebuild takes it under a lease of its
  // own); before, it retried "not connected" until its 10-minute deadline and kept every scale
  // and rebuild out meanwhile.
  ASSERT_TRUE(WaitFor([&] { return LockLease() != running; }, seconds(90)))
      << "the rebuild whose source died still holds the controller lock 90 s later";
  std::printf("the rebuild gave the controller lock up %.1f s after its source was killed\n",
              MsSince(killed) / 1000);
  // Then every slot whose primary lives has a backup and nothing is being filled (a fill from
  // server 2 left flipped is given up); server 2's slots without a backup wait for it.
  std::string left;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto now = store_->Load();
        if (!now.ok()) return false;
        for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
          if (now->importing[slot] != ClusterMap::kNoServer ||
              (now->primary[slot] != 2 && now->backup[slot] == ClusterMap::kNoServer)) {
            left = "slot " + std::to_string(slot) + " at map version " +
                   std::to_string(now->version);
            return false;
          }
        }
        return true;
      },
      seconds(90)))
      << "not backed up again: " << left;
  // and the lock is free once that is done.
  EXPECT_TRUE(WaitFor([&] { return LockIsFree(); }, seconds(90)));
}


// Servers that rebuild nothing themselves: only the test's `tessera-ctl map rebuild` changes
// the map by more than one step, while the servers' watchers fail over.
class LostSwapTest : public ReplicatedClusterTest {
 protected:
  LostSwapTest() : ReplicatedClusterTest("tessera/lost-swap") {
    server_flags_ = {"--rebuild_backups=false"};
  }
};

TEST_F(LostSwapTest, ARebuildThatLosesItsSwapToAFailOverSaysWhatHappened) {
  // Server 2's slots lose their backups; a paced rebuild by hand copies them to server 0 in
  // batches of 512 slots (about 50 times as long a pause as each batch took).
  ASSERT_NO_FATAL_FAILURE(DropBackupsOfServerTwo(*store_));
  int rc = -1;
  std::string out;
  std::thread ctl([&] {
    rc = RunCommand({TESSERA_CTL_BINARY, "map", "rebuild", "--coordinator=" + url_,
                     "--pace=0.02", "--batch_slots=512", "--timeout_s=300"},
                    &out);
  });
  // Once its first batch settled (version 4), server 1 dies: the watchers promote its backups
  // while the rebuild pauses, and the rebuild's next swap is made from the version before.
  const bool started = WaitFor(
      [&] {
        auto now = store_->Load();
        return now.ok() && now->version >= 4;
      },
      seconds(60));
  if (started) cluster_->Kill(1);
  ctl.join();
  ASSERT_TRUE(started) << "the rebuild did not start: " << out;
  EXPECT_EQ(rc, 1) << out;
  const size_t said = out.rfind("tessera-ctl:");
  std::printf("tessera-ctl map rebuild said:\n%s\n",
              out.substr(said == std::string::npos ? 0 : said).c_str());
  EXPECT_NE(out.find("another writer changed the map while this run held the controller lock"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("slots of server 1 were failed over to their backups (a fail-over: server 1 "
                     "died)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("run `tessera-ctl map rebuild` again"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera::testing
