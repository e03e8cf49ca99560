// Fencing by cluster map version (docs/elasticity.md): real tessera-server processes started
// with --coordinator follow the map in a real etcd; clients created with an
// EtcdClusterMapSource route by it; requests of an older version, and keys of slots a server
// no longer owns, are refused and apply nothing; the client reloads the map and retries.
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>

#include "ps/client/client.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/slot_map_store.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/raw_peer.h"
#include "tests/worker/worker_process.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/fence";
constexpr uint32_t kDim = 4;

// A map source over the real etcd whose watch never delivers: a client that learns of a new
// map only when a server refuses its request (the path a lagging or broken watch leaves).
class UnwatchedSource final : public ClusterMapSource {
 public:
  explicit UnwatchedSource(std::unique_ptr<EtcdClusterMapSource> etcd) : etcd_(std::move(etcd)) {}
  Result<RoutingMap> Load() override { return etcd_->Load(); }
  Status Watch(RoutingMapCallback) override { return Status::OK(); }

 private:
  std::unique_ptr<EtcdClusterMapSource> etcd_;
};

class FencingTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    url_ = etcd_.url(kPrefix);
    LocalClusterOptions o = Servers(2);
    o.extra_flags = {"--coordinator=" + url_};
    cluster_ = std::make_unique<LocalCluster>(o);
    Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    admin_ = AdminClient(cluster_->endpoints());
    ASSERT_NE(admin_, nullptr);
    store_ = std::make_unique<SlotMapStore>(client_.get(), "/" + std::string(kPrefix));
  }

  // tessera-ctl map init of the cluster's servers; waits until both serve by version 1.
  void InitMap() {
    std::string servers;
    for (const auto& e : cluster_->endpoints()) servers += (servers.empty() ? "" : ",") + e;
    std::string out;
    ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url_,
                          "--servers=" + servers},
                         &out),
              0)
        << out;
    WaitForServers(1);
  }

  uint64_t ServerMapVersion(uint32_t r) {
    auto st = admin_->ServerStats(r);
    return st.ok() ? static_cast<uint64_t>(StatOf(*st, "map_version")) : 0;
  }
  int64_t ServerStat(uint32_t r, const std::string& key) {
    auto st = admin_->ServerStats(r);
    return st.ok() ? StatOf(*st, key) : -1;
  }
  void WaitForServers(uint64_t version) {
    ASSERT_TRUE(WaitFor([&] { return ServerMapVersion(0) == version && ServerMapVersion(1) == version; },
                        seconds(30)))
        << "servers at " << ServerMapVersion(0) << ", " << ServerMapVersion(1) << ", not "
        << version;
  }

  std::unique_ptr<EtcdClusterMapSource> Source() {
    auto s = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // `o`: consistency and worker id (the servers come from the map).
  std::unique_ptr<Client> CoordinatorClient(bool watch = true, ClientOptions o = {}) {
    std::unique_ptr<ClusterMapSource> source = Source();
    if (!watch) source = std::make_unique<UnwatchedSource>(Source());
    o.request_timeout_ms = 10000;
    o.retry_for_ms = 20000;  // a broken reroute fails the test in 20 s, not 120
    auto c = Client::Create(o, std::move(source));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The map at `version` + 1 with the same servers; slots [begin, end) given to `to`.
  void Bump(uint64_t version, uint32_t begin = 0, uint32_t end = 0, uint16_t to = 0) {
    auto m = store_->Load();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->version, version);
    ClusterMap next = *m;
    next.version = version + 1;
    for (uint32_t s = begin; s < end; ++s) next.primary[s] = to;
    Status s = store_->CompareAndSwap(version, next);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // The map at version 1, a watching client, and workers 0 ("fast") and 1 ("slow") of a job of
  // 2 with staleness 0: a read of fast's waits for slow's clock.
  struct GatedClients {
    std::unique_ptr<Client> watching, fast, slow;
  };
  void StartGatedClients(GatedClients* c) {
    InitMap();
    c->watching = CoordinatorClient();
    ClientOptions o;
    o.consistency = {.num_workers = 2, .staleness = 0};
    o.worker_id = 0;
    c->fast = CoordinatorClient(/*watch=*/true, o);
    o.worker_id = 1;
    c->slow = CoordinatorClient(/*watch=*/true, o);
    ASSERT_TRUE(c->watching != nullptr && c->fast != nullptr && c->slow != nullptr);
  }

  static Table Sparse(Client& c, const std::string& name) {
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;  // zeros initializer: a pushed gradient g reads back as -g
    auto t = c.CreateTable(TableSpec::Sparse(name, kDim, sgd));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : Table{};
  }

  // `n` keys whose slots are in [begin, end).
  static std::vector<uint64_t> KeysInSlots(uint32_t begin, uint32_t end, size_t n) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 1; keys.size() < n; ++k) {
      const uint32_t s = SlotOfKey(k);
      if (s >= begin && s < end) keys.push_back(k);
    }
    return keys;
  }
  static std::vector<float> Grads(const std::vector<uint64_t>& keys) {
    std::vector<float> g(keys.size() * kDim);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * static_cast<float>(i % 13) + 0.5f;
    return g;
  }
  static void ExpectValues(Client& c, const Table& t, const std::vector<uint64_t>& keys,
                           const std::vector<float>& grads, float times) {
    std::vector<float> out(keys.size() * kDim, -999.0f);
    Status s = c.Wait(c.Pull(t, keys, out.data()));
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], -times * grads[i]) << "key " << keys[i / kDim] << " element " << i % kDim;
    }
  }

  std::string url_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> admin_;  // a static client: stats, table creation
  std::unique_ptr<SlotMapStore> store_;
};

// (a) Push and pull through two servers by the map in etcd; without a map, Create says how to
// make one.
TEST_F(FencingTest, CoordinatorClientPushesAndPullsThroughTwoServers) {
  {
    ClientOptions o;
    auto none = Client::Create(o, Source());
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(none.status().message().find("tessera-ctl map init"), std::string::npos)
        << none.status().ToString();
  }
  InitMap();
  std::string out;
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &out), 0)
      << out;
  EXPECT_NE(out.find("version 1"), std::string::npos) << out;
  EXPECT_NE(out.find("server 1 server-1 " + cluster_->endpoints()[1] + " primary_slots 8192"),
            std::string::npos)
      << out;

  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->cluster_map_version(), 1u);
  EXPECT_EQ(c->num_servers(), 2u);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysInSlots(0, kNumSlots, 2000);
  const std::vector<float> g = Grads(keys);
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  ExpectValues(*c, t, keys, g, 1.0f);
  // Both servers took a part, and nothing was refused.
  EXPECT_GT(ServerStat(0, "push_keys"), 0);
  EXPECT_GT(ServerStat(1, "push_keys"), 0);
  EXPECT_EQ(ServerStat(0, "push_keys") + ServerStat(1, "push_keys"), 2000);
  EXPECT_EQ(ServerStat(0, "stale_map_refusals"), 0);
  EXPECT_EQ(c->stale_map_retries(), 0u);
}

// (b) A version bump (same owners): a request of the old version is refused and applies
// nothing; clients go on, the lagging one by reloading the map when refused.
TEST_F(FencingTest, OldVersionIsRefusedAndClientsReloadAndRetry) {
  InitMap();
  auto watching = CoordinatorClient();
  auto lagging = CoordinatorClient(/*watch=*/false);
  ASSERT_NE(watching, nullptr);
  ASSERT_NE(lagging, nullptr);
  const Table t = Sparse(*watching, "emb");
  const std::vector<uint64_t> keys = KeysInSlots(0, kNumSlots / 4, 300);  // server 0's
  const std::vector<float> g = Grads(keys);
  ASSERT_TRUE(watching->Wait(watching->Push(t, keys, g)).ok());
  // A push of another client at version 1 whose reply we pretend was lost.
  RawPeer peer(cluster_->endpoints()[0]);
  const std::vector<uint64_t> keys2 = KeysInSlots(kNumSlots / 4, kNumSlots / 2, 50);
  const std::vector<float> g2 = Grads(keys2);
  Header retry = SparseHeader(Op::kSparsePush, t.id, keys2.size(), kDim);
  retry.map_version = 1;
  retry.client_id = 777;
  retry.client_seq = 1;
  const std::vector<std::string> retry_frames = {Bytes(keys2), Bytes(g2)};
  ASSERT_EQ(peer.Call(retry, retry_frames).status, StatusCode::kOk);

  const auto bumped = std::chrono::steady_clock::now();
  Bump(1);
  WaitForServers(2);
  const double servers_ms = MsSince(bumped);
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == 2; }, seconds(30)));
  std::printf("map version 2 (CAS included) seen by both servers after %.0f ms, by the watching "
              "client after %.0f ms (polled every 20 ms)\n",
              servers_ms, MsSince(bumped));

  // Its retry, still of version 1, is answered as a retry: not refused (the client would send
  // it elsewhere under a new number) and not applied again.
  Header rr = peer.Call(retry, retry_frames);
  EXPECT_EQ(rr.status, StatusCode::kOk) << rr.message;
  ExpectValues(*watching, t, keys2, g2, 1.0f);
  EXPECT_EQ(ServerStat(0, "retried_pushes"), 1);

  // A raw push of version 1 to server 0: refused, naming both versions; nothing applied.
  Header h = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
  h.map_version = 1;
  h.client_id = 12345;
  h.client_seq = 1;
  Header r = peer.Call(h, {Bytes(keys), Bytes(g)});
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("stale cluster map: request has version 1, server 0 is at 2"),
            std::string::npos)
      << r.message;
  EXPECT_EQ(r.map_version, 2u);
  EXPECT_EQ(ServerStat(0, "stale_map_refusals"), 1);
  // A static request (version 0) is stale too on a server that follows a map.
  h.map_version = 0;
  h.client_seq = 2;
  r = peer.Call(h, {Bytes(keys), Bytes(g)});
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  ExpectValues(*watching, t, keys, g, 1.0f);  // neither refused push was applied

  // The same push again with the current version: the refusals took none of the client's
  // numbers, so the server knows no push of it, and number 3 could be the resend of a push
  // whose mark is gone: refused Aborted, nothing applied (wire-protocol.md, "Exactly-once
  // pushes"). Under a new numbering (a new id, number 1, as the client library does) it is
  // applied once.
  h.map_version = 2;
  h.client_seq = 3;
  r = peer.Call(h, {Bytes(keys), Bytes(g)});
  EXPECT_EQ(r.status, StatusCode::kAborted) << r.message;
  h.client_id = 12346;
  h.client_seq = 1;
  r = peer.Call(h, {Bytes(keys), Bytes(g)});
  EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
  ExpectValues(*watching, t, keys, g, 2.0f);

  // The watching client follows (its watch, or a refusal and a reload).
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == 2; }, seconds(30)));
  ASSERT_TRUE(watching->Wait(watching->Push(t, keys, g)).ok());
  ExpectValues(*watching, t, keys, g, 3.0f);

  // The lagging client is still at 1: its push is refused, it reloads, and it is applied once.
  EXPECT_EQ(lagging->cluster_map_version(), 1u);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = lagging->Wait(lagging->Push(t, keys, g));
  const double recover_ms = MsSince(t0);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(lagging->cluster_map_version(), 2u);
  EXPECT_GE(lagging->stale_map_retries(), 1u);
  ExpectValues(*lagging, t, keys, g, 4.0f);
  std::printf("lagging client: push refused as stale, map reloaded, applied in %.1f ms "
              "(%llu reroute(s))\n",
              recover_ms, static_cast<unsigned long long>(lagging->stale_map_retries()));
}

// (c) Slots moved from server 0 to server 1 (an empty table: no data to migrate): server 0
// refuses their keys, clients send them to server 1.
TEST_F(FencingTest, MovedSlotsAreRefusedByTheOldOwnerAndRoutedToTheNew) {
  InitMap();
  auto lagging = CoordinatorClient(/*watch=*/false);
  auto watching = CoordinatorClient();
  ASSERT_NE(lagging, nullptr);
  ASSERT_NE(watching, nullptr);
  const Table t = Sparse(*watching, "emb");
  // Server 0 has slots [0, 8192) at version 1; version 2 gives [0, 4096) to server 1.
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  const std::vector<uint64_t> moved = KeysInSlots(0, kNumSlots / 4, 200);
  const std::vector<float> g = Grads(moved);

  // Server 0 refuses a moved key even at the current version.
  RawPeer peer(cluster_->endpoints()[0]);
  Header h = SparseHeader(Op::kSparsePull, t.id, 1, kDim);
  h.map_version = 2;
  Header r = peer.Call(h, {Bytes(std::vector<uint64_t>{moved[0]})});
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("stale cluster map: key " + std::to_string(moved[0])),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("belongs to server 1 at map version 2, not server 0"),
            std::string::npos)
      << r.message;

  // The lagging client sends them to server 0 by version 1, is refused, reloads, and sends
  // them to server 1.
  const int64_t before0 = ServerStat(0, "push_keys"), before1 = ServerStat(1, "push_keys");
  Status s = lagging->Wait(lagging->Push(t, moved, g));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(lagging->stale_map_retries(), 1u);
  EXPECT_EQ(ServerStat(0, "push_keys"), before0);
  EXPECT_EQ(ServerStat(1, "push_keys"), before1 + 200);
  ExpectValues(*lagging, t, moved, g, 1.0f);

  // The watching client routes them to server 1 directly.
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == 2; }, seconds(30)));
  ASSERT_TRUE(watching->Wait(watching->Push(t, moved, g)).ok());
  EXPECT_EQ(watching->stale_map_retries(), 0u);
  EXPECT_EQ(ServerStat(1, "push_keys"), before1 + 400);
  ExpectValues(*watching, t, moved, g, 2.0f);
}

// (c) continued: a request refused as stale whose keys now belong to two servers is split,
// each server gets its keys, and a pull's rows land where they belong.
TEST_F(FencingTest, ARequestSpanningAMovedAndAKeptSlotIsSplit) {
  InitMap();
  auto pusher = CoordinatorClient(/*watch=*/false);
  auto puller = CoordinatorClient(/*watch=*/false);
  ASSERT_NE(pusher, nullptr);
  ASSERT_NE(puller, nullptr);
  const Table t = Sparse(*pusher, "split");
  // Server 0's keys at version 1, alternating between slots that move and slots that stay.
  const std::vector<uint64_t> moving = KeysInSlots(0, kNumSlots / 4, 100);
  const std::vector<uint64_t> staying = KeysInSlots(kNumSlots / 4, kNumSlots / 2, 100);
  std::vector<uint64_t> keys;
  for (size_t i = 0; i < 100; ++i) {
    keys.push_back(moving[i]);
    keys.push_back(staying[i]);
  }
  const std::vector<float> g = Grads(keys);
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  const int64_t before0 = ServerStat(0, "push_keys"), before1 = ServerStat(1, "push_keys");
  Status s = pusher->Wait(pusher->Push(t, keys, g));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(pusher->stale_map_retries(), 1u);
  EXPECT_EQ(ServerStat(0, "push_keys"), before0 + 100);
  EXPECT_EQ(ServerStat(1, "push_keys"), before1 + 100);
  // The puller still routes by version 1: its pull is refused and split the same way.
  ExpectValues(*puller, t, keys, g, 1.0f);
  EXPECT_GE(puller->stale_map_retries(), 1u);
}

// (c) continued: a pull parked by the staleness gate at version 1 is fenced again when it is
// released after its slots moved: refused by the old owner, it reads the new owner's rows.
TEST_F(FencingTest, AParkedPullIsFencedAgainWhenItRuns) {
  GatedClients clients;
  ASSERT_NO_FATAL_FAILURE(StartGatedClients(&clients));
  auto& [watching, fast, slow] = clients;
  const Table t = Sparse(*watching, "parked");
  const std::vector<uint64_t> moved = KeysInSlots(0, kNumSlots / 4, 50);  // server 0's at v1
  const std::vector<float> g = Grads(moved);
  ASSERT_TRUE(watching->Wait(watching->Push(t, moved, g)).ok());  // server 0's rows: -g
  ASSERT_TRUE(fast->Wait(fast->SetClock(2)).ok());
  ASSERT_TRUE(slow->Wait(slow->SetClock(0)).ok());
  std::vector<float> out(moved.size() * kDim, -999.0f);
  Handle pull = fast->Pull(t, moved, out.data());  // waits on server 0 for worker 1
  ASSERT_EQ(fast->Wait(pull, DeadlineAfterMs(300)).code(), StatusCode::kDeadlineExceeded);
  // The slots move to server 1, whose rows of them are new (zeros), then get 3g.
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == 2; }, seconds(30)));
  std::vector<float> g3(g.size());
  for (size_t i = 0; i < g.size(); ++i) g3[i] = 3 * g[i];
  ASSERT_TRUE(watching->Wait(watching->Push(t, moved, g3)).ok());
  // Worker 1 catches up: server 0 releases the pull, refuses it as stale, and the client
  // reads the keys from server 1.
  ASSERT_TRUE(slow->Wait(slow->SetClock(2)).ok());
  Status s = fast->Wait(pull, DeadlineAfterMs(30000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], -3 * g[i]) << "key " << moved[i / kDim] << " element " << i % kDim;
  }
  EXPECT_GE(fast->stale_map_retries(), 1u);
}

// A client's push held behind its push-pull parked by the staleness gate (its pushes are logged
// in its order) goes back with it when the push-pull, released after its slots moved, is
// refused as stale: the push is refused Unavailable with its number given back, the client
// sends both again, and each applies once (the push-pull on the slots' new owner).
TEST_F(FencingTest, APushHeldBehindAFencedPushPullIsRefusedWithItAndBothApplyOnce) {
  GatedClients clients;
  ASSERT_NO_FATAL_FAILURE(StartGatedClients(&clients));
  auto& [watching, fast, slow] = clients;
  const Table t = Sparse(*watching, "held");
  const std::vector<uint64_t> moved = KeysInSlots(0, kNumSlots / 4, 50);  // server 0, then 1
  const std::vector<uint64_t> kept = KeysInSlots(kNumSlots / 4, kNumSlots / 2, 50);  // server 0
  const std::vector<float> g = Grads(moved), gk = Grads(kept);
  ASSERT_TRUE(fast->Wait(fast->SetClock(2)).ok());
  ASSERT_TRUE(slow->Wait(slow->SetClock(0)).ok());
  std::vector<float> out(moved.size() * kDim, -999.0f);
  Handle push_pull = fast->PushPull(t, moved, g, out.data());  // waits for worker 1
  ASSERT_EQ(fast->Wait(push_pull, DeadlineAfterMs(300)).code(), StatusCode::kDeadlineExceeded);
  Handle push = fast->Push(t, kept, gk);
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "held_behind_parked_now") == 1; }, seconds(30)));
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  ASSERT_TRUE(slow->Wait(slow->SetClock(2)).ok());
  Status s = fast->Wait(push_pull, DeadlineAfterMs(30000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = fast->Wait(push, DeadlineAfterMs(30000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], -g[i]) << "element " << i;
  ASSERT_TRUE(WaitFor([&] { return watching->cluster_map_version() == 2; }, seconds(30)));
  ExpectValues(*watching, t, moved, g, 1.0f);
  ExpectValues(*watching, t, kept, gk, 1.0f);
  EXPECT_EQ(ServerStat(0, "held_behind_parked_now"), 0);
  EXPECT_EQ(ServerStat(0, "held_behind_parked_total"), 1);
}

// The pushes of a client behind one of its pushes refused for a resend (here the push held
// behind a push-pull that was fenced when the gate released it) wait for that resend: a later
// push in flight is refused Unavailable (PushDedup kBlocked) rather than taken, whose logging
// would make the refused one's resend look applied. A resend the server fences again (its map
// is old: the client sends it under a new number) closes the gap. Raw requests of one client.
TEST_F(FencingTest, PushesBehindOneRefusedForAResendWaitForIt) {
  GatedClients clients;
  ASSERT_NO_FATAL_FAILURE(StartGatedClients(&clients));
  Client& watching = *clients.watching;
  const Table t = Sparse(watching, "gap");
  const uint64_t moved = KeysInSlots(0, kNumSlots / 4, 1)[0];                // server 0, then 1
  const uint64_t kept = KeysInSlots(kNumSlots / 4, kNumSlots / 2, 1)[0];  // server 0
  RawPeer peer(cluster_->endpoints()[0]);
  auto push = [&](uint64_t seq, uint64_t version, Op op = Op::kSparsePush) {
    Header h = SparseHeader(op, t.id, 1, kDim);
    h.client_id = 0x9a9;
    h.client_seq = seq;
    h.map_version = version;
    h.worker_id = 0;
    h.num_workers = 2;
    h.clock = 1;
    h.staleness = 0;
    return h;
  };
  const auto frames = [](uint64_t key) {
    return std::vector<std::string>{Bytes(std::vector<uint64_t>{key}),
                                    Bytes(std::vector<float>(kDim, 1.0f))};
  };
  ASSERT_TRUE(peer.Send(push(1, 1, Op::kSparsePushPull), frames(moved)));  // the gate
  const Header second = push(2, 1);
  ASSERT_TRUE(peer.Send(second, frames(kept)));  // held behind it
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "held_behind_parked_now") == 1; }, seconds(30)));
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  RawPeer clocks(cluster_->endpoints()[0]);
  for (uint32_t w : {0u, 1u}) {
    Header c;
    c.op = Op::kClock;
    c.worker_id = w;
    c.num_workers = 2;
    c.clock = 1;
    ASSERT_EQ(clocks.Call(c).status, StatusCode::kOk);
  }
  std::map<uint64_t, StatusCode> first;  // request id -> status
  for (int i = 0; i < 2; ++i) {
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(peer.socket(), std::back_inserter(reply)));
    Header r;
    ASSERT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
    first[r.request_id] = r.status;
  }
  EXPECT_EQ(first[1], StatusCode::kFailedPrecondition);  // fenced: the client renumbers it
  EXPECT_EQ(first[2], StatusCode::kUnavailable);         // held: sent again as it is
  Header third = peer.Call(push(3, 2), frames(kept));
  EXPECT_EQ(third.status, StatusCode::kUnavailable) << third.message;  // waits for push 2
  // Push 2 sent again as it was (map version 1): fenced, so it will get a new number.
  EXPECT_EQ(peer.Call(second, frames(kept)).status, StatusCode::kFailedPrecondition);
  EXPECT_EQ(peer.Call(push(3, 2), frames(kept)).status, StatusCode::kOk);
  EXPECT_EQ(peer.Call(push(4, 2), frames(kept)).status, StatusCode::kOk);  // push 2 anew
  std::vector<float> out(kDim);
  ASSERT_TRUE(watching.Wait(watching.Pull(t, std::vector<uint64_t>{kept}, out.data())).ok());
  EXPECT_EQ(out, std::vector<float>(kDim, -2.0f));  // pushes 3 and 4, once each
  EXPECT_EQ(ServerStat(0, "retried_pushes"), 0);
}

// tessera-worker --coordinator: the map names the servers; before a map exists the worker says
// how to make one; with one it trains, following a move of a quarter of the slots made while
// it runs (its pushes to the old owner are refused and sent again to the new one).
TEST_F(FencingTest, WorkerWithCoordinatorTrainsThroughAMapMove) {
  const std::vector<std::string> args = {TESSERA_WORKER_BINARY,
                                         "--coordinator=" + url_,
                                         "--job=elastic",
                                         "--consistency=bsp",
                                         "--train_samples=400000",
                                         "--test_samples=1000",
                                         "--batch_size=128",
                                         "--max_steps=600",
                                         "--synthetic_max_cardinality=20000",
                                         "--bottom_mlp=8",
                                         "--top_mlp=8",
                                         "--evaluate=false",
                                         "--request_timeout_ms=10000",
                                         "--retry_for_ms=30000",
                                         "--out_dir=" + cluster_->dir()};
  {
    ChildProcess early;
    ASSERT_TRUE(early.Start(args, cluster_->dir() + "/worker-nomap.log"));
    EXPECT_EQ(early.Wait(60), 1) << early.Output();
    EXPECT_NE(early.Output().find("tessera-ctl map init"), std::string::npos) << early.Output();
  }
  InitMap();
  ChildProcess worker;
  ASSERT_TRUE(worker.Start(args, cluster_->dir() + "/worker.log"));
  // Both servers take pushes by map version 1, then server 0's first 4096 slots move.
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "pushes") > 5 && ServerStat(1, "pushes") > 5; },
                      seconds(60)))
      << worker.Output();
  const int64_t server1_before = ServerStat(1, "pushes");
  Bump(1, 0, kNumSlots / 4, 1);
  WaitForServers(2);
  ASSERT_TRUE(worker.Running())
      << "the worker ended before the map moved; raise --max_steps: " << worker.Output();
  ASSERT_EQ(worker.Wait(300), 0) << worker.Output();
  EXPECT_NE(worker.Output().find("600 steps"), std::string::npos) << worker.Output();
  EXPECT_GT(ServerStat(1, "pushes"), server1_before);
  EXPECT_EQ(ServerMapVersion(0), 2u);
}

// (d) A static cluster ignores map versions: a request of any version is served.
TEST(StaticClusterFencing, VersionsAreIgnoredWithoutACoordinator) {
  LocalCluster cluster(Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions o;
  o.servers = cluster.endpoints();
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  auto t = (*c)->CreateTable(TableSpec::Sparse("emb", kDim, sgd));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*c)->cluster_map_version(), 0u);
  const uint64_t key = 7;
  const std::vector<float> g = {1, 2, 3, 4};
  RawPeer peer(cluster.endpoints()[0]);
  Header h = SparseHeader(Op::kSparsePush, t->id, 1, kDim);
  h.map_version = 99;
  Header r = peer.Call(h, {Bytes(std::vector<uint64_t>{key}), Bytes(g)});
  EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
  EXPECT_EQ(r.map_version, 0u);
  std::vector<float> out(kDim);
  ASSERT_TRUE((*c)->Wait((*c)->Pull(*t, std::span<const uint64_t>(&key, 1), out.data())).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -2, -3, -4}));
  auto st = (*c)->ServerStats(0);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(StatOf(*st, "map_version"), 0);
}

}  // namespace
}  // namespace tessera::testing
