// Many servers on one machine (issue 37): 16 tessera-server processes on 127.0.0.1 and 8
// clients (threads, each with a Client of its own) pushing and pulling sparse and dense tables
// at once, every value checked exactly; and a client that routes by a cluster map of 10,000
// server ids, the 16 live ones spread among ids that are retired, through a newer version of
// that map, with descriptors and memory that do not grow with the retired ids.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/cluster_map_source.h"
#include "ps/mutex.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

constexpr uint32_t kServers = 16;
constexpr uint32_t kClients = 8;
constexpr uint32_t kDim = 8;

OptimizerSpec Sgd() {
  OptimizerSpec o;
  o.kind = OptimizerKind::kSgd;
  o.learning_rate = 1.0f;
  return o;
}

// Small integers: sums of up to a few hundred of them are exact in float, in any order, so the
// final values do not depend on how the servers interleaved the clients' pushes.
float Grad(uint32_t client, uint32_t round, size_t i) {
  return static_cast<float>(static_cast<int>((client * 7 + round * 3 + i) % 9) - 4);
}

// One cluster of 16 servers for every test of this file (starting 16 processes is the slow
// part on a small machine).
class ManyServersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new testing::LocalCluster(testing::Servers(kServers));
    start_ = cluster_->Start();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(start_.ok()) << start_.ToString(); }

  static testing::LocalCluster* cluster_;
  static Status start_;
};
testing::LocalCluster* ManyServersTest::cluster_ = nullptr;
Status ManyServersTest::start_;

// Keys of every server: `per_server` keys whose slots each of the 16 servers owns.
std::vector<uint64_t> KeysOfEveryServer(uint32_t per_server, uint64_t salt) {
  const SlotMap map = SlotMap::Uniform(kServers);
  std::vector<uint64_t> keys;
  std::vector<uint32_t> count(kServers, 0);
  for (uint64_t k = salt; keys.size() < size_t{per_server} * kServers; ++k) {
    const uint64_t key = Mix64(k);  // spread over the key space
    uint32_t& c = count[map.ServerOfKey(key)];
    if (c < per_server) {
      ++c;
      keys.push_back(key);
    }
  }
  return keys;
}

TEST_F(ManyServersTest, SixteenServersEightClientsPushAndPullExactly) {
  ClientOptions options;
  options.servers = cluster_->endpoints();
  auto setup = Client::Create(options);
  ASSERT_TRUE(setup.ok()) << setup.status().ToString();
  // Integer initial values (here 0, the default) keep every sum exact whatever the order.
  auto sparse = (*setup)->CreateTable(TableSpec::Sparse("emb", kDim, Sgd()));
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  // 40 chunks: every server holds 2 or 3 of them.
  constexpr uint64_t kDenseLen = 40 * kDenseChunkFloats;
  auto dense = (*setup)->CreateTable(TableSpec::Dense("mlp", kDenseLen, Sgd()));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  for (uint32_t s = 0; s < kServers; ++s) {
    ASSERT_FALSE(DenseRangeOfServer(dense->id, kDenseLen, s, kServers).begin ==
                 DenseRangeOfServer(dense->id, kDenseLen, s, kServers).end)
        << "server " << s << " holds no part of the dense table";
  }

  // Shared keys (every client pushes them) and private keys (one client each), on all servers.
  const std::vector<uint64_t> shared = KeysOfEveryServer(32, 1);
  std::vector<std::vector<uint64_t>> own(kClients);
  for (uint32_t c = 0; c < kClients; ++c) own[c] = KeysOfEveryServer(4, 1000000 * (c + 1));
  std::vector<float> shared_before(shared.size() * kDim);
  ASSERT_TRUE((*setup)->Wait((*setup)->Pull(*sparse, shared, shared_before.data())).ok());
  std::vector<float> dense_before(kDenseLen);
  ASSERT_TRUE((*setup)->Wait((*setup)->DensePull(*dense, 0, kDenseLen, dense_before.data())).ok());

  // Client c pushes to the dense range [c * kStride, c * kStride + kSpan): ranges overlap their
  // neighbours' and each crosses several servers.
  constexpr uint64_t kStride = 4 * kDenseChunkFloats;
  constexpr uint64_t kSpan = 10 * kDenseChunkFloats;
  static_assert((kClients - 1) * kStride + kSpan <= kDenseLen);
  constexpr uint32_t kRounds = 20;

  Mutex errors_mu;
  std::vector<std::string> errors;
  auto fail = [&](std::string e) {
    MutexLock l(errors_mu);
    errors.push_back(std::move(e));
  };
  std::vector<std::thread> threads;
  for (uint32_t c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Client::Create(options);
      if (!client.ok()) return fail("client " + std::to_string(c) + ": " + client.status().ToString());
      Client& cl = **client;
      auto t = cl.GetTable("emb");
      auto d = cl.GetTable("mlp");
      if (!t.ok() || !d.ok()) return fail("client " + std::to_string(c) + ": GetTable failed");
      const std::vector<uint64_t>& mine = own[c];
      std::vector<float> expect(mine.size() * kDim);
      if (!cl.Wait(cl.Pull(*t, mine, expect.data())).ok()) return fail("first pull");
      for (uint32_t r = 0; r < kRounds; ++r) {
        std::vector<float> g(mine.size() * kDim), gs(shared.size() * kDim), gd(kSpan);
        for (size_t i = 0; i < g.size(); ++i) g[i] = Grad(c, r, i);
        for (size_t i = 0; i < gs.size(); ++i) gs[i] = Grad(c, r, i + 1);
        for (size_t i = 0; i < gd.size(); ++i) gd[i] = Grad(c, r, i + 2);
        // The pushes in flight together: sparse private, sparse shared, dense.
        Handle h1 = cl.Push(*t, mine, g);
        Handle h2 = cl.Push(*t, shared, gs);
        Handle h3 = cl.DensePush(*d, c * kStride, gd);
        for (const auto& h : {h1, h2, h3}) {
          Status s = cl.Wait(h);
          if (!s.ok()) return fail("client " + std::to_string(c) + " push: " + s.ToString());
        }
        for (size_t i = 0; i < expect.size(); ++i) expect[i] -= g[i];
        // Read-your-writes on 16 servers: this client's own rows, exactly.
        std::vector<float> got(expect.size());
        Status s = cl.Wait(cl.Pull(*t, mine, got.data()));
        if (!s.ok()) return fail("client " + std::to_string(c) + " pull: " + s.ToString());
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i] != expect[i]) {
            return fail("client " + std::to_string(c) + " round " + std::to_string(r) +
                        " key " + std::to_string(mine[i / kDim]) + ": got " +
                        std::to_string(got[i]) + ", expected " + std::to_string(expect[i]));
          }
        }
        if (!cl.Wait(cl.Clock()).ok()) return fail("clock");
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(errors.empty()) << errors.front();

  // Everything every client pushed, in whatever order the servers applied it.
  std::vector<float> shared_want = shared_before, dense_want = dense_before;
  for (uint32_t c = 0; c < kClients; ++c) {
    for (uint32_t r = 0; r < kRounds; ++r) {
      for (size_t i = 0; i < shared_want.size(); ++i) shared_want[i] -= Grad(c, r, i + 1);
      for (uint64_t i = 0; i < kSpan; ++i) dense_want[c * kStride + i] -= Grad(c, r, i + 2);
    }
  }
  std::vector<float> shared_after(shared_want.size()), dense_after(kDenseLen);
  ASSERT_TRUE((*setup)->Wait((*setup)->Pull(*sparse, shared, shared_after.data())).ok());
  ASSERT_TRUE((*setup)->Wait((*setup)->DensePull(*dense, 0, kDenseLen, dense_after.data())).ok());
  for (size_t i = 0; i < shared_want.size(); ++i) {
    ASSERT_EQ(shared_after[i], shared_want[i]) << "shared key " << shared[i / kDim] << " element "
                                               << i % kDim;
  }
  for (uint64_t i = 0; i < kDenseLen; ++i) {
    ASSERT_EQ(dense_after[i], dense_want[i]) << "dense element " << i;
  }
}

// A source whose map the test replaces: Watch keeps the callback, Publish delivers a newer
// version on the caller's thread (as a source's own thread would).
class SettableMapSource final : public ClusterMapSource {
 public:
  explicit SettableMapSource(RoutingMap m) : map_(std::move(m)) {}
  Result<RoutingMap> Load() override {
    MutexLock l(mu_);
    return map_;
  }
  Status Watch(RoutingMapCallback callback) override {
    RoutingMap m;
    {
      MutexLock l(mu_);
      callback_ = std::move(callback);
      m = map_;
    }
    callback_(m);
    return Status::OK();
  }
  void Publish(RoutingMap m) {
    RoutingMapCallback cb;
    {
      MutexLock l(mu_);
      map_ = m;
      cb = callback_;
    }
    if (cb) cb(m);
  }

 private:
  Mutex mu_;
  RoutingMap map_ GUARDED_BY(mu_);
  RoutingMapCallback callback_ GUARDED_BY(mu_);
};

constexpr uint32_t kIds = 10000;

// The id that server s of the static cluster has in the 10,000-id map: spread over the ids
// (625 apart), as after many scale-ups, fail-overs and scale-downs.
uint16_t IdOf(uint32_t s) { return static_cast<uint16_t>(s * (kIds / kServers) + 311); }

// 10,000 ids, 16 of them live (the static cluster's servers, owning the slots and dense parts
// their ranks own); every other id retired.
RoutingMap TenThousandIds(const std::vector<std::string>& endpoints, uint64_t version) {
  RoutingMap m;
  m.version = version;
  m.addresses.assign(kIds, "");
  std::vector<uint16_t> owners = SlotMap::Uniform(kServers).owners();
  for (uint16_t& o : owners) o = IdOf(o);
  m.primary = *SlotMap::FromOwners(std::move(owners), kIds);
  m.dense_servers = kServers;
  for (uint32_t s = 0; s < kServers; ++s) {
    m.addresses[IdOf(s)] = endpoints[s];
    m.dense_primary.push_back(IdOf(s));
  }
  return m;
}

int OpenDescriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// Resident memory of this process in KiB (VmRSS of /proc/self/status).
long ResidentKiB() {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof(line), f) != nullptr) {
    if (strncmp(line, "VmRSS:", 6) == 0) kib = strtol(line + 6, nullptr, 10);
  }
  fclose(f);
  return kib;
}

void PushAndPullExactly(Client& c, const Table& sparse, const Table& dense, float step) {
  const std::vector<uint64_t> keys = KeysOfEveryServer(8, 77);
  std::vector<float> before(keys.size() * kDim), after(before.size()), g(before.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = step * static_cast<float>(i % 5 + 1);
  ASSERT_TRUE(c.Wait(c.Pull(sparse, keys, before.data())).ok());
  Status pushed = c.Wait(c.Push(sparse, keys, g));
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  ASSERT_TRUE(c.Wait(c.Pull(sparse, keys, after.data())).ok());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_EQ(after[i], before[i] - g[i]) << "key " << keys[i / kDim] << " element " << i % kDim;
  }
  const uint64_t len = 20 * kDenseChunkFloats;  // parts of every server
  std::vector<float> d0(len), d1(len), dg(len, step);
  ASSERT_TRUE(c.Wait(c.DensePull(dense, 0, len, d0.data())).ok());
  ASSERT_TRUE(c.Wait(c.DensePush(dense, 0, dg)).ok());
  ASSERT_TRUE(c.Wait(c.DensePull(dense, 0, len, d1.data())).ok());
  for (uint64_t i = 0; i < len; ++i) ASSERT_EQ(d1[i], d0[i] - step) << "dense element " << i;
}

TEST_F(ManyServersTest, AMapOfTenThousandIdsRoutesToTheSixteenLiveOnes) {
  const int fds_before = OpenDescriptors();
  const long rss_before = ResidentKiB();
  auto owned = std::make_unique<SettableMapSource>(TenThousandIds(cluster_->endpoints(), 5));
  SettableMapSource* source = owned.get();
  auto created = Client::Create(ClientOptions{}, std::move(owned));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Client& c = **created;
  EXPECT_EQ(c.num_servers(), kIds);
  auto sparse = c.CreateTable(TableSpec::Sparse("wide", kDim, Sgd()));
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  auto dense = c.CreateTable(TableSpec::Dense("wide_dense", 20 * kDenseChunkFloats, Sgd()));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  PushAndPullExactly(c, *sparse, *dense, 1.0f);

  // The next version of the map, as etcd would bring it: one more id (retired), the same 16
  // live. The client follows it and routes by it.
  RoutingMap next = TenThousandIds(cluster_->endpoints(), 6);
  next.addresses.emplace_back();
  std::vector<uint16_t> owners = next.primary.owners();
  next.primary = *SlotMap::FromOwners(std::move(owners), kIds + 1);
  source->Publish(next);
  EXPECT_EQ(c.num_servers(), kIds + 1);
  std::vector<uint32_t> live;
  for (uint32_t s = 0; s < kServers; ++s) live.push_back(IdOf(s));
  EXPECT_EQ(c.server_ids(), live);
  auto stats = c.ServerStats(IdOf(kServers - 1));
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  PushAndPullExactly(c, *sparse, *dense, 2.0f);

  // The client's sockets are per live server, not per id: 10,001 ids with descriptors would
  // need several thousand; 16 servers need a few each. Nor does the map cost memory per id
  // beyond its strings (generous bound: 64 MiB for the client, its tables' buffers included).
  const int fds = OpenDescriptors() - fds_before;
  EXPECT_LT(fds, 16 * 8) << fds << " descriptors opened for 16 live servers of 10,001 ids";
  const long rss = ResidentKiB() - rss_before;
  EXPECT_LT(rss, 64 * 1024) << rss << " KiB for a client of 10,001 ids";
}

}  // namespace
}  // namespace tessera
