// Fail-over by promotion (ps/coord/failover.h) against a real etcd: FailoverWatchers of fake
// members (Membership objects, no tessera-server) promote the backups of a member that leaves,
// once, and nothing while members come up; `tessera-ctl map init --replication=2`, `map show`
// and `scale` refusing a replicated map.
#include "ps/coord/failover.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kPrefix[] = "/tessera/promote";
constexpr int kTtlS = 2;

std::string Address(uint32_t i) { return "tcp://127.0.0.1:" + std::to_string(7100 + i); }

// Version 1 of a map of servers server-0..n-1 with a backup per slot (the next server), dense
// tables on server 0 only.
ClusterMap ReplicatedMap(uint32_t n) {
  std::vector<MapServer> servers;
  for (uint32_t i = 0; i < n; ++i) servers.push_back({"server-" + std::to_string(i), Address(i)});
  auto m = ClusterMap::Replicated(std::move(servers), 2);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  m->dense_servers = 1;
  m->dense_primary.resize(1);  // part 0 on server 0, backed up by server 1
  m->dense_backup.resize(1);
  return *m;
}

class PromotionTest : public EtcdTest {
 protected:
  // Registers member server-`i` with a short TTL.
  std::unique_ptr<Membership> Register(uint32_t i) {
    MembershipOptions o;
    o.prefix = kPrefix;
    o.member_id = "server-" + std::to_string(i);
    o.address = Address(i);
    o.ttl_s = kTtlS;
    auto m = Membership::Register(client_.get(), o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // A watcher for member server-`i`, polling every 100 ms, whose log lines go to lines_;
  // `more` changes its options further.
  std::unique_ptr<FailoverWatcher> Watch(uint32_t i,
                                         const std::function<void(FailoverOptions&)>& more = {}) {
    FailoverOptions o;
    o.prefix = kPrefix;
    o.self_id = "server-" + std::to_string(i);
    o.poll_ms = 100;
    o.log = [this, i](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back("[server-" + std::to_string(i) + "] " + line);
    };
    if (more) more(o);
    auto w = FailoverWatcher::Start(client_.get(), o);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(*w) : nullptr;
  }

  std::string Lines() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(PromotionTest, ALeavingMembersBackupsArePromotedOnceAndItIsRetired) {
  SlotMapStore store(client_.get(), kPrefix);
  const ClusterMap v1 = ReplicatedMap(3);
  ASSERT_TRUE(store.Create(v1).ok());
  std::vector<std::unique_ptr<Membership>> members;
  for (uint32_t i = 0; i < 3; ++i) members.push_back(Register(i));
  ASSERT_TRUE(members[2] != nullptr);
  // Two watchers (servers 0 and 2) race for the same change: it is made once.
  auto w0 = Watch(0), w2 = Watch(2);
  ASSERT_TRUE(w0 && w2);
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= 2 && w2->rounds() >= 2; }, seconds(10)));
  EXPECT_EQ(store.Load()->version, 1u) << Lines();  // everyone alive: nothing changes

  const auto left = std::chrono::steady_clock::now();
  members[1].reset();  // deregisters: the lease is revoked, the key goes at once
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store.Load();
        return m.ok() && m->version >= 2;
      },
      seconds(10)))
      << Lines();
  std::printf("member left -> map promoted: %.0f ms (poll 100 ms)\n", MsSince(left));
  // Let both watchers look again: neither changes the map a second time.
  const int64_t r0 = w0->rounds(), r2 = w2->rounds();
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= r0 + 3 && w2->rounds() >= r2 + 3; },
                      seconds(10)));
  auto v2 = store.Load();
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->version, 2u) << Lines();
  EXPECT_EQ(w0->promotions() + w2->promotions(), 1) << Lines();
  uint32_t of1 = 0;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (v1.primary[slot] == 1) {
      ++of1;
      ASSERT_EQ(v2->primary[slot], 2) << slot;
      ASSERT_EQ(v2->backup[slot], ClusterMap::kNoServer) << slot;
    } else {
      ASSERT_EQ(v2->primary[slot], v1.primary[slot]) << slot;
      ASSERT_EQ(v2->backup[slot], v1.backup[slot] == 1 ? ClusterMap::kNoServer : v1.backup[slot])
          << slot;
    }
  }
  EXPECT_EQ(w0->slots_promoted() + w2->slots_promoted(), of1);
  EXPECT_EQ(v2->servers[1].id, "server-1");
  EXPECT_EQ(v2->servers[1].address, "");  // retired: not a dense server, named nowhere
  EXPECT_EQ(v2->servers[0].address, Address(0));
  EXPECT_EQ(v2->servers[2].address, Address(2));
  EXPECT_NE(Lines().find("promoted server 2 to primary of " + std::to_string(of1) +
                         " slots of dead server 1 at map version 2"),
            std::string::npos)
      << Lines();
  EXPECT_TRUE(w0->last_error().ok()) << w0->last_error().ToString();

  // Server 2 dies too: its slots' backup (server 0) takes them; server 2's old slots of server
  // 1 have no backup any more and stay with it (unavailable), so it is not retired.
  members[2].reset();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store.Load();
        return m.ok() && m->version >= 3;
      },
      seconds(10)))
      << Lines();
  auto v3 = store.Load();
  ASSERT_TRUE(v3.ok());
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_EQ(v3->primary[slot], v1.primary[slot] == 0 ? 0 : (v1.primary[slot] == 2 ? 0 : 2))
        << slot;
  }
  EXPECT_EQ(v3->servers[2].address, Address(2));
  ASSERT_TRUE(WaitFor([&] { return Lines().find("have no live backup") != std::string::npos; },
                      seconds(5)))
      << Lines();
  w2.reset();
  w0.reset();
  std::printf("%s", Lines().c_str());
}

TEST_F(PromotionTest, NothingIsPromotedWhileMembersComeUpOrWhenTheWatcherIsNotAMember) {
  SlotMapStore store(client_.get(), kPrefix);
  ASSERT_TRUE(store.Create(ReplicatedMap(3)).ok());
  // Server 0 comes up alone; 1 and 2 register later (a cold start, one after another).
  auto m0 = Register(0);
  auto w0 = Watch(0);
  ASSERT_TRUE(m0 && w0);
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= 8; }, seconds(10)));
  auto m1 = Register(1);
  std::this_thread::sleep_for(milliseconds(300));
  auto m2 = Register(2);
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(store.Load()->version, 1u) << Lines();

  // A watcher whose own member is not listed (cut off, or not registered) acts on nothing:
  // server 0 leaves, then server 1 leaves while only 0 watched; 0 is not there to act.
  m0.reset();
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= 12; }, seconds(10)));
  const int64_t r = w0->rounds();
  m1.reset();
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= r + 5; }, seconds(10)));
  EXPECT_EQ(store.Load()->version, 1u) << Lines();
  EXPECT_EQ(w0->promotions(), 0);
  EXPECT_TRUE(w0->last_error().ok()) << w0->last_error().ToString();

  // A poll period of 0 is refused (tessera-server's --failover_poll_ms=0 starts no watcher).
  FailoverOptions no_period;
  no_period.prefix = kPrefix;
  no_period.self_id = "server-0";
  no_period.poll_ms = 0;
  EXPECT_EQ(FailoverWatcher::Start(client_.get(), no_period).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(PromotionTest, AnUnreplicatedMapIsLeftAlone) {
  SlotMapStore store(client_.get(), kPrefix);
  std::vector<MapServer> servers = {{"server-0", Address(0)}, {"server-1", Address(1)},
                                    {"server-2", Address(2)}};
  ClusterMap plain = ClusterMap::Uniform(servers);
  plain.dense_servers = 1;
  ASSERT_TRUE(store.Create(plain).ok());
  auto m0 = Register(0), m1 = Register(1), m2 = Register(2);
  auto w0 = Watch(0);
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= 3; }, seconds(10)));
  m2.reset();  // server 2 leaves: it owns slots without a backup; nothing to promote or retire
  const int64_t r = w0->rounds();
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= r + 5; }, seconds(10)));
  EXPECT_EQ(*store.Load(), plain) << Lines();
  EXPECT_EQ(w0->promotions(), 0);
}

// tessera-ctl map init --replication and map show (no servers needed: map init does not
// contact them).
TEST_F(PromotionTest, CtlMapInitReplicationAndShow) {
  const std::string url = etcd_.url(std::string(kPrefix).substr(1));
  const std::string servers = Address(0) + "," + Address(1) + "," + Address(2);
  std::string out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url,
                        "--servers=" + servers, "--replication=3"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("--replication must be 1 or 2, got 3"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url,
                        "--servers=" + servers, "--replication=0"},
                       &out),
            2)
      << out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url,
                        "--servers=" + Address(0), "--replication=2"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("needs at least 2 --servers, got 1"), std::string::npos) << out;
  SlotMapStore store(client_.get(), kPrefix);
  EXPECT_EQ(store.Load().status().code(), StatusCode::kNotFound);  // usage errors wrote nothing

  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url,
                        "--servers=" + servers, "--replication=2"},
                       &out),
            0)
      << out;
  auto m = store.Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_EQ(m->backup[slot], (m->primary[slot] + 1) % 3) << slot;
  }
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url}, &out), 0);
  EXPECT_NE(out.find("server 1 server-1 " + Address(1) + " primary_slots 5461 backup_slots 5462"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("slots_with_backup 16384 of 16384"), std::string::npos) << out;
}

// A watcher calls on_unbacked while its server is the lowest live one and a slot of a live
// primary has no backup: the lowest server, not another, and not while it is alone.
TEST_F(PromotionTest, TheLowestLiveServerIsToldWhenARebuildIsDue) {
  SlotMapStore store(client_.get(), kPrefix);
  auto m = std::make_unique<ClusterMap>(ReplicatedMap(3));
  for (uint32_t slot = 0; slot < kNumSlots; slot += 7) m->backup[slot] = ClusterMap::kNoServer;
  ASSERT_TRUE(store.Create(*m).ok());
  auto m0 = Register(0), m1 = Register(1), m2 = Register(2);
  std::atomic<int> due0{0}, due1{0};
  auto watch = [&](uint32_t i, std::atomic<int>* due) {
    return Watch(i, [due](FailoverOptions& o) {
      o.poll_ms = 50;
      o.unbacked_every_ms = 200;
      o.on_unbacked = [due] { ++*due; };
    });
  };
  auto w0 = watch(0, &due0), w1 = watch(1, &due1);
  ASSERT_TRUE(WaitFor([&] { return due0.load() >= 2; }, seconds(10)));
  EXPECT_EQ(due1.load(), 0) << "server 1 is not the lowest live server";
  // Every slot backed up again: nothing more is due.
  ClusterMap whole = *m;
  whole.version = 2;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    whole.backup[slot] = (whole.primary[slot] + 1) % 3;
  }
  ASSERT_TRUE(store.CompareAndSwap(1, whole).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int settled = due0.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(due0.load(), settled) << "told of a rebuild with every slot backed up";
}

// A double failure can leave a replicated map without any backup (the rebuild after the first
// failure had not finished when the second server died): its watcher still sees a replicated
// map (by its replication factor, not by the backups left) and tells the lowest live server
// that a rebuild is due.
TEST_F(PromotionTest, AReplicatedMapWithoutAnyBackupLeftIsStillRebuilt) {
  SlotMapStore store(client_.get(), kPrefix);
  ClusterMap m = ReplicatedMap(3);
  m.backup.assign(kNumSlots, ClusterMap::kNoServer);
  m.dense_backup.assign(1, ClusterMap::kNoServer);
  ASSERT_TRUE(store.Create(m).ok());
  auto m0 = Register(0), m1 = Register(1), m2 = Register(2);
  std::atomic<int> due{0};
  auto w0 = Watch(0, [&due](FailoverOptions& o) {
    o.poll_ms = 50;
    o.unbacked_every_ms = 200;
    o.on_unbacked = [&due] { ++due; };
  });
  ASSERT_TRUE(WaitFor([&] { return due.load() >= 1; }, seconds(10)))
      << "no rebuild due for a replicated map without backups; " << Lines();
}

// The controller lock (PREFIX/controller): while another process holds it, tessera-ctl scale
// and map rebuild wait for it until their --timeout_s and then exit 1 naming the holder,
// changing nothing; once it is released they run.
TEST_F(PromotionTest, TheControllerLockKeepsControllersApart) {
  const std::string url = etcd_.url(std::string(kPrefix).substr(1));
  SlotMapStore store(client_.get(), kPrefix);
  ASSERT_TRUE(store.Create(ReplicatedMap(3)).ok());
  auto m0 = Register(0), m1 = Register(1), m2 = Register(2);
  MembershipOptions lock;
  lock.prefix = kPrefix;
  lock.member_id = "other-controller";
  lock.address = "controller";
  lock.key = ControllerKey(kPrefix);
  auto held = Membership::Register(client_.get(), lock);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // A second holder is refused, naming the first.
  lock.member_id = "second";
  auto second = Membership::Register(client_.get(), lock);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find("is held by other-controller"), std::string::npos)
      << second.status().ToString();
  std::string out;
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{TESSERA_CTL_BINARY, "scale", "3", "--coordinator=" + url,
                                 "--timeout_s=1"},
        std::vector<std::string>{TESSERA_CTL_BINARY, "map", "rebuild", "--coordinator=" + url,
                                 "--timeout_s=1"}}) {
    EXPECT_EQ(RunCommand(cmd, &out), 1) << out;
    EXPECT_NE(out.find("/controller is held by other-controller"), std::string::npos) << out;
    EXPECT_NE(out.find("another controller is changing the map"), std::string::npos) << out;
  }
  EXPECT_EQ(store.Load()->version, 1u);
  (*held).reset();  // released: the lease is revoked
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "rebuild", "--coordinator=" + url,
                        "--timeout_s=10"},
                       &out),
            0)
      << out;  // every slot has a backup: nothing to do
}

// on_joined: the lowest live server's watcher reports servers registered under the next ids
// (with the number the map should have), also for a map without backups; not while a server
// of the map is not listed, and not from another server's watcher.
TEST_F(PromotionTest, TheLowestLiveServerIsToldOfServersWaitingToJoin) {
  SlotMapStore store(client_.get(), kPrefix);
  const ClusterMap two = ClusterMap::Uniform({{"server-0", Address(0)}, {"server-1", Address(1)}});
  ASSERT_TRUE(store.Create(two).ok());
  auto m0 = Register(0), m1 = Register(1);
  std::atomic<uint32_t> told0{0}, told1{0};
  auto watch = [&](uint32_t i, std::atomic<uint32_t>* told) {
    return Watch(i, [told](FailoverOptions& o) {
      o.poll_ms = 50;
      o.unbacked_every_ms = 100;
      o.on_joined = [told](uint32_t n) { *told = n; };
    });
  };
  auto w0 = watch(0, &told0), w1 = watch(1, &told1);
  ASSERT_TRUE(WaitFor([&] { return w0->rounds() >= 5; }, seconds(10)));
  EXPECT_EQ(told0.load(), 0u) << "nobody waits to join";
  auto m2 = Register(2), m3 = Register(3);
  ASSERT_TRUE(WaitFor([&] { return told0.load() == 4; }, seconds(10))) << told0.load();
  EXPECT_EQ(told1.load(), 0u) << "server 1 is not the lowest live server";
  // A scale that added server 2 to the map and stopped before moving slots to it: server 2 is
  // named by no slot, and is reported (server 3 no longer registered).
  m3.reset();
  ClusterMap added = *store.Load();
  added.version = 2;
  added.servers.push_back({"server-2", Address(2)});
  ASSERT_TRUE(store.CompareAndSwap(1, added).ok());
  ASSERT_TRUE(WaitFor([&] { return told0.load() == 3; }, seconds(10))) << told0.load();
  // Server 1 gone (a map without backups: nothing is promoted): no join while it is missing.
  m1.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  told0 = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(told0.load(), 0u) << "told of a join while a server of the map is missing";
  // Server 1 retired (its slots on server 0, as a fail-over leaves them) and registered again
  // (restarted under its --rank): counted with the live ones (server 2, named by no slot, is
  // one: 2 without server 1).
  ClusterMap retired = *store.Load();
  retired.version = 3;
  retired.servers[1].address.clear();
  std::fill(retired.primary.begin(), retired.primary.end(), 0);
  ASSERT_TRUE(store.CompareAndSwap(2, retired).ok());
  ASSERT_TRUE(WaitFor([&] { return told0.load() == 2; }, seconds(10))) << told0.load();
  m1 = Register(1);
  ASSERT_TRUE(WaitFor([&] { return told0.load() == 3; }, seconds(10))) << told0.load();
  // A server leaving (--drain_on_stop marks its record before it drains) is none to take in:
  // server 1, registered again but leaving, is not counted (2: servers 0 and 2), and once
  // server 2, named by no slot, leaves too, nothing is due.
  ASSERT_TRUE(m1->MarkLeaving().ok());
  ASSERT_TRUE(WaitFor([&] { return told0.load() == 2; }, seconds(10))) << told0.load();
  ASSERT_TRUE(m2->MarkLeaving().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  told0 = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(told0.load(), 0u) << "told to take in servers that are leaving";
}

}  // namespace
}  // namespace tessera::testing
