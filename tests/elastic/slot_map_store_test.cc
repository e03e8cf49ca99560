// The cluster map record in a real etcd: create, load, compare-and-swap, racing writers, and a
// watch that resumes across an etcd restart.
#include "ps/coord/slot_map_store.h"

#include <algorithm>
#include <atomic>
#include <latch>
#include <mutex>
#include <thread>

#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

ClusterMap TwoServers() {
  return ClusterMap::Uniform({{"s0", "tcp://127.0.0.1:7000"}, {"s1", "tcp://127.0.0.1:7001"}});
}

// `m` one version on, with `slot` moved to server `to` (a stand-in for a resharding step).
ClusterMap Moved(ClusterMap m, uint32_t slot, uint16_t to) {
  m.version += 1;
  m.primary[slot] = to;
  return m;
}

TEST_F(EtcdTest, CreateLoadCompareAndSwap) {
  SlotMapStore store(client_.get(), "/tessera/job");
  EXPECT_EQ(store.key(), "/tessera/job/slotmap");
  EXPECT_EQ(store.Load().status().code(), StatusCode::kNotFound);
  ClusterMap v1 = TwoServers();
  ASSERT_TRUE(store.Create(v1).ok());
  Status again = store.Create(v1);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("version 1"), std::string::npos) << again.ToString();
  auto loaded = store.Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, v1);

  ClusterMap v2 = Moved(v1, 0, 1);
  ASSERT_TRUE(store.CompareAndSwap(1, v2).ok());
  EXPECT_EQ(*store.Load(), v2);
  EXPECT_EQ(store.Load()->PrimaryMap()->ServerOfSlot(0), 1u);

  Status stale = store.CompareAndSwap(1, Moved(v1, 1, 1));
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("is at version 2, not 1"), std::string::npos) << stale.ToString();
  EXPECT_EQ(store.CompareAndSwap(2, v2).code(), StatusCode::kInvalidArgument);  // not v3
  ClusterMap broken = Moved(v2, 0, 7);                                          // no server 7
  EXPECT_EQ(store.CompareAndSwap(2, broken).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*store.Load(), v2);

  // Latency of a CAS (a read and a transaction), median of 21.
  std::vector<double> ms;
  ClusterMap cur = v2;
  for (int i = 0; i < 21; ++i) {
    ClusterMap next = Moved(cur, 100 + i, static_cast<uint16_t>(i % 2));
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(store.CompareAndSwap(cur.version, next).ok());
    ms.push_back(MsSince(start));
    cur = next;
  }
  std::sort(ms.begin(), ms.end());
  std::printf("slot map CAS: median %.2f ms, max %.2f ms (21 swaps)\n", ms[10], ms.back());
}

TEST_F(EtcdTest, CompareAndSwapRefusesAChangeMadeBetweenReadAndWrite) {
  SlotMapStore store(client_.get(), "/tessera/job");
  ASSERT_TRUE(store.Create(TwoServers()).ok());
  // A writer that does not bump the version (a bug or a rogue tool) still changes the record's
  // mod_revision: the CAS of a writer who read before it must fail, not overwrite it.
  auto kv = client_->Get(store.key());
  ASSERT_TRUE(kv.ok() && kv->has_value());
  ASSERT_TRUE(client_->Put(store.key(), (*kv)->value).ok());
  TxnRequest txn;
  txn.compares.push_back({store.key(), TxnCompare::Target::kModRevision, (*kv)->mod_revision});
  txn.success.push_back(TxnOp::Put(store.key(), "x"));
  EXPECT_FALSE(client_->Txn(txn)->succeeded);
}

TEST_F(EtcdTest, RacingWritersExactlyOneWins) {
  SlotMapStore setup(client_.get(), "/tessera/race");
  ASSERT_TRUE(setup.Create(TwoServers()).ok());
  constexpr int kWriters = 6, kRounds = 15;
  std::vector<std::unique_ptr<EtcdClient>> clients;
  for (int w = 0; w < kWriters; ++w)
    clients.push_back(std::move(EtcdClient::Create(etcd_.options()).value()));
  int lost_in_txn = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto current = setup.Load();
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    std::latch go(kWriters);
    std::vector<Status> results(kWriters);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWriters; ++w) {
      threads.emplace_back([&, w] {
        SlotMapStore store(clients[w].get(), "/tessera/race");
        // Each writer moves a different slot, so the stored map says who won.
        ClusterMap next = Moved(*current, 1000 + w, current->primary[1000 + w] ^ 1);
        go.arrive_and_wait();
        results[w] = store.CompareAndSwap(current->version, next);
      });
    }
    for (auto& t : threads) t.join();
    int winners = 0, winner = -1;
    for (int w = 0; w < kWriters; ++w) {
      if (results[w].ok()) {
        ++winners;
        winner = w;
      } else {
        EXPECT_EQ(results[w].code(), StatusCode::kFailedPrecondition) << results[w].ToString();
        if (results[w].message().find("another writer won") != std::string::npos) ++lost_in_txn;
      }
    }
    ASSERT_EQ(winners, 1) << "round " << round;
    auto stored = setup.Load();
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->version, current->version + 1);
    EXPECT_EQ(*stored, Moved(*current, 1000 + winner, current->primary[1000 + winner] ^ 1));
  }
  // How many losers got past the version check and were stopped by the transaction itself.
  std::printf("%d rounds of %d writers: %d losers refused by the mod_revision compare\n", kRounds,
              kWriters, lost_in_txn);
}

// Versions a watch delivered, under a lock.
struct Versions {
  std::mutex mu;
  std::vector<uint64_t> seen;
  std::vector<Status> errors;
  uint64_t last() {
    std::lock_guard<std::mutex> lock(mu);
    return seen.empty() ? 0 : seen.back();
  }
  ClusterMapCallback callback() {
    return [this](const Result<ClusterMap>& m) {
      std::lock_guard<std::mutex> lock(mu);
      if (m.ok()) {
        seen.push_back(m->version);
      } else {
        errors.push_back(m.status());
      }
    };
  }
};

TEST_F(EtcdTest, WatchDeliversEachVersionAndResumesAfterEtcdRestarts) {
  SlotMapStore store(client_.get(), "/tessera/job");
  EXPECT_EQ(store.Watch([](const Result<ClusterMap>&) {}).status().code(), StatusCode::kNotFound);
  ClusterMap v1 = TwoServers();
  ASSERT_TRUE(store.Create(v1).ok());
  Versions versions;
  WatchOptions tuning;
  tuning.reconnect_backoff_ms = 50;
  auto watch = store.Watch(versions.callback(), tuning);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  EXPECT_EQ(versions.last(), 1u);  // the current map, before Watch returns

  ClusterMap v2 = Moved(v1, 0, 1);
  ASSERT_TRUE(store.CompareAndSwap(1, v2).ok());
  ASSERT_TRUE(WaitFor([&] { return versions.last() == 2; }, seconds(30)));

  // etcd dies. While the watch cannot reach it, v3 is written: etcd runs for a moment on the
  // same data dir but another client port. Then it comes back on the watched port, and the
  // watch must resume from the revision after v2 to see v3 (a fresh stream would miss it).
  const uint16_t watched_port = etcd_.client_port();
  etcd_.Kill();
  Status elsewhere = etcd_.Restart(PickFreePort());
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.ToString();
  auto other_client = EtcdClient::Create(etcd_.options());
  ASSERT_TRUE(other_client.ok());
  ClusterMap v3 = Moved(v2, 1, 1);
  ASSERT_TRUE(SlotMapStore(other_client->get(), "/tessera/job").CompareAndSwap(2, v3).ok());
  etcd_.Kill();
  Status back = etcd_.Restart(watched_port);
  ASSERT_TRUE(back.ok()) << back.ToString();
  ASSERT_TRUE(WaitFor([&] { return versions.last() == 3; }, seconds(60)))
      << "the watch did not resume after the restart";
  ClusterMap v4 = Moved(v3, 2, 1);
  ASSERT_TRUE(store.CompareAndSwap(3, v4).ok());
  ASSERT_TRUE(WaitFor([&] { return versions.last() == 4; }, seconds(30)));
  watch->reset();
  std::lock_guard<std::mutex> lock(versions.mu);
  EXPECT_EQ(versions.seen, (std::vector<uint64_t>{1, 2, 3, 4}));  // each once, in order
  EXPECT_TRUE(versions.errors.empty());
}

TEST_F(EtcdTest, WatchRereadsTheMapWhenTheVersionsItMissedWereCompacted) {
  SlotMapStore store(client_.get(), "/tessera/job");
  ClusterMap v1 = TwoServers();
  ASSERT_TRUE(store.Create(v1).ok());
  Versions versions;
  WatchOptions tuning;
  tuning.reconnect_backoff_ms = 50;
  auto watch = store.Watch(versions.callback(), tuning);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  // While the watch cannot reach etcd: v2 and v3 are written and the history compacted.
  const uint16_t watched_port = etcd_.client_port();
  etcd_.Kill();
  ASSERT_TRUE(etcd_.Restart(PickFreePort()).ok());
  auto other = EtcdClient::Create(etcd_.options());
  ASSERT_TRUE(other.ok());
  SlotMapStore elsewhere(other->get(), "/tessera/job");
  ClusterMap v2 = Moved(v1, 0, 1), v3 = Moved(v2, 1, 1);
  ASSERT_TRUE(elsewhere.CompareAndSwap(1, v2).ok());
  ASSERT_TRUE(elsewhere.CompareAndSwap(2, v3).ok());
  // Compacted past v3's own revision too (etcd keeps the revision compacted at), so the stream
  // alone cannot deliver v3: only a read of the record can.
  auto later = (*other)->Put("/unrelated", "x");
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE((*other)->Compact(*later).ok());
  etcd_.Kill();
  ASSERT_TRUE(etcd_.Restart(watched_port).ok());
  // v2's revision is gone: the watch reads the record and delivers v3; v2 is skipped, and
  // nothing is delivered twice.
  ASSERT_TRUE(WaitFor([&] { return versions.last() == 3; }, seconds(60)));
  ASSERT_TRUE(store.CompareAndSwap(3, Moved(v3, 2, 1)).ok());
  ASSERT_TRUE(WaitFor([&] { return versions.last() == 4; }, seconds(30)));
  watch->reset();
  std::lock_guard<std::mutex> lock(versions.mu);
  EXPECT_EQ(versions.seen, (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_TRUE(versions.errors.empty());
}

}  // namespace
}  // namespace tessera::testing
