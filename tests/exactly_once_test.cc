// Exactly-once pushes on a real tessera-server with RocksDB (strict): a push sent again with the
// same client id and sequence number (a retry after a lost reply) is answered OK and not
// applied again, also after the server was killed with SIGKILL and restarted; a retried
// push-pull returns the values without applying the push twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using testing::LocalCluster;

constexpr uint32_t kDim = 4;
constexpr uint64_t kClient = 0x5eed5eed5eedULL;

// Push (or push-pull) of gradient `g` on every element of `key`, as push `seq` of kClient, sent
// by hand (the client library numbers its pushes itself). A push-pull's values go to *values.
Header PushRaw(testing::RawPeer& peer, const Table& t, uint64_t key, float g, uint64_t seq,
               Op op = Op::kSparsePush, std::vector<float>* values = nullptr) {
  Header h = testing::SparseHeader(op, t.id, 1, kDim);
  h.client_id = kClient;
  h.client_seq = seq;
  std::vector<std::string> reply;
  Header r = peer.Call(h,
                       {testing::Bytes(std::vector<uint64_t>{key}),
                        testing::Bytes(std::vector<float>(kDim, g))},
                       &reply);
  if (values != nullptr && reply.size() == 1) {
    values->resize(reply[0].size() / sizeof(float));
    std::memcpy(values->data(), reply[0].data(), reply[0].size());
  }
  return r;
}

float Value(Client* c, const Table& t, uint64_t key) {
  std::vector<float> v(kDim, -1);
  Status s =
      c->Wait(c->Pull(t, std::span<const uint64_t>(&key, 1), v.data()), DeadlineAfterMs(10000));
  EXPECT_TRUE(s.ok()) << s.ToString();
  for (float x : v) EXPECT_EQ(x, v[0]);
  return v[0];
}

int64_t Stat(Client* c, const std::string& name) {
  auto stats = c->ServerStats(0, DeadlineAfterMs(10000));
  if (!stats.ok()) return -1;
  std::smatch m;
  if (!std::regex_search(*stats, m, std::regex("(^|\n)" + name + " (\\d+)"))) return -1;
  return std::stoll(m[2]);
}

// Waits until server 0's stat `name` reaches `at_least` (background work: the row writer, the
// maintenance pass). A generous limit: the event, not the machine's speed, is what counts.
bool WaitForStat(Client* c, const std::string& name, int64_t at_least) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (Stat(c, name) < at_least) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// One server with a RocksDB data directory, a client (retries on) and the SGD table "eo".
struct DurableServer {
  explicit DurableServer(testing::LocalClusterOptions o) : cluster(std::move(o)) {}
  // Starts the server and creates the table; false after a test failure otherwise.
  bool Start() {
    if (!cluster.Start().ok()) return false;
    ClientOptions co;
    co.servers = cluster.endpoints();
    auto created = Client::Create(co);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return false;
    client = std::move(*created);
    OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
    auto t = client->CreateTable(TableSpec::Sparse("eo", kDim, sgd));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (!t.ok()) return false;
    table = *t;
    return true;
  }
  LocalCluster cluster;
  std::unique_ptr<Client> client;
  Table table;
};

TEST(ExactlyOnceTest, RetriedPushAppliesOnceAcrossACrash) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  DurableServer server(o);
  ASSERT_TRUE(server.Start());
  LocalCluster& cluster = server.cluster;
  Client* c = server.client.get();
  const Table* table = &server.table;
  const uint64_t key = 12345;

  testing::RawPeer peer(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(peer, *table, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -1.0f);
  // The same push again (its reply was lost): answered OK, not applied.
  EXPECT_EQ(PushRaw(peer, *table, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -1.0f);
  EXPECT_EQ(Stat(c, "retried_pushes"), 1);
  EXPECT_EQ(PushRaw(peer, *table, key, 1.0f, 2).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -2.0f);

  // Kill -9 before the rows are written back (every 2 s), restart: the request log holds the
  // pushes and their client sequence numbers.
  cluster.Kill(0);
  ASSERT_TRUE(cluster.Restart(0).ok());
  testing::RawPeer again(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(again, *table, key, 1.0f, 2).status, StatusCode::kOk);
  EXPECT_EQ(PushRaw(again, *table, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -2.0f);
  // A retried push-pull returns the values and applies nothing.
  std::vector<float> values;
  EXPECT_EQ(PushRaw(again, *table, key, 1.0f, 3, Op::kSparsePushPull, &values).status,
            StatusCode::kOk);
  EXPECT_EQ(values, std::vector<float>(kDim, -3.0f));
  values.clear();
  EXPECT_EQ(PushRaw(again, *table, key, 1.0f, 3, Op::kSparsePushPull, &values).status,
            StatusCode::kOk);
  EXPECT_EQ(values, std::vector<float>(kDim, -3.0f));
  EXPECT_EQ(Value(c, *table, key), -3.0f);

  // A second crash after the maintenance pass truncated the log (the marks then come from the
  // stored record, not from log entries).
  ASSERT_TRUE(WaitForStat(c, "log_truncated_to", Stat(c, "log_last_seq")));
  cluster.Kill(0);
  ASSERT_TRUE(cluster.Restart(0).ok());
  testing::RawPeer third(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(third, *table, key, 1.0f, 3).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -3.0f);
  EXPECT_EQ(PushRaw(third, *table, key, 1.0f, 4).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -4.0f);
}

// Rows written back (the lane marks cover the pushes) but the log not yet truncated, so the
// stored client marks are older than the pushes: a retried push after a crash is still
// recognised, from the log entries at or below the marks.
TEST(ExactlyOnceTest, RetriedPushAppliesOnceWhenRowsAreDurableBeforeTheLogIsTruncated) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  o.lanes = 1;  // one mark: the lowest mark then covers every push
  // Rows go out every 50 ms; the maintenance pass (which truncates the log) never comes.
  o.extra_flags = {"--write_back_interval_ms=50", "--maintenance_interval_ms=3600000"};
  DurableServer server(o);
  ASSERT_TRUE(server.Start());
  LocalCluster& cluster = server.cluster;
  Client* c = server.client.get();
  const Table* table = &server.table;
  const uint64_t key = 777;
  testing::RawPeer peer(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(peer, *table, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(PushRaw(peer, *table, key, 1.0f, 2).status, StatusCode::kOk);
  const int64_t last = Stat(c, "log_last_seq");
  ASSERT_GE(last, 2);
  ASSERT_TRUE(WaitForStat(c, "lane0_durable_log_mark", last));
  EXPECT_LT(Stat(c, "log_truncated_to"), last);  // the case this test is about
  cluster.Kill(0);
  ASSERT_TRUE(cluster.Restart(0).ok());
  testing::RawPeer again(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(again, *table, key, 1.0f, 2).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, *table, key), -2.0f);
  EXPECT_EQ(Stat(c, "retried_pushes"), 1);
}

// The client library numbers its pushes itself: a server restart between pushes costs a stall,
// and every push applies exactly once.
TEST(ExactlyOnceTest, ClientRidesThroughARestartWithoutDoubleApplying) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions co;
  co.servers = cluster.endpoints();
  co.retry_for_ms = 60000;
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Client* c = client->get();
  OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  auto table = c->CreateTable(TableSpec::Sparse("ride", kDim, sgd));
  ASSERT_TRUE(table.ok());
  const uint64_t key = 99;
  const std::vector<float> g(kDim, 1.0f);
  constexpr int kPushes = 300;
  std::vector<Handle> handles;
  // A third in flight when the server dies, a third sent while it is down (they wait in the
  // client's retry queue), a third after it is back.
  for (int i = 0; i < kPushes / 3; ++i) {
    handles.push_back(c->Push(*table, std::span<const uint64_t>(&key, 1), g));
  }
  cluster.Kill(0);
  for (int i = 0; i < kPushes / 3; ++i) {
    handles.push_back(c->Push(*table, std::span<const uint64_t>(&key, 1), g));
  }
  Status rs = cluster.Restart(0);
  ASSERT_TRUE(rs.ok()) << rs.ToString();
  for (int i = 0; i < kPushes / 3; ++i) {
    handles.push_back(c->Push(*table, std::span<const uint64_t>(&key, 1), g));
  }
  for (auto& h : handles) {
    Status s = c->Wait(h, DeadlineAfterMs(60000));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(Value(c, *table, key), -static_cast<float>(kPushes));
}

// Push `seq` of kClient from worker 0 of 2 at clock 1, staleness 0: a push-pull waits at the
// staleness gate until worker 1 reaches clock 1.
Header GatedPush(const Table& t, uint64_t seq, Op op) {
  Header h = testing::SparseHeader(op, t.id, 1, kDim);
  h.client_id = kClient;
  h.client_seq = seq;
  h.worker_id = 0;
  h.num_workers = 2;
  h.clock = 1;
  h.staleness = 0;
  return h;
}

std::vector<std::string> KeyAndGrad(uint64_t key) {
  return {testing::Bytes(std::vector<uint64_t>{key}),
          testing::Bytes(std::vector<float>(kDim, 1.0f))};
}

testing::LocalClusterOptions GatedServerOptions(std::vector<std::string> flags) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  o.extra_flags = std::move(flags);
  return o;
}

// Sends the gated push-pull (seq 1, key 1) and a push (seq 2, key 2) of kClient; returns once
// the server has taken both in (held or, as before the fix, logged).
void SendPushPullThenPush(testing::RawPeer& peer, Client* c, const Table& t) {
  const int64_t requests = Stat(c, "requests"), logged = Stat(c, "log_last_seq");
  ASSERT_TRUE(peer.Send(GatedPush(t, 1, Op::kSparsePushPull), KeyAndGrad(1)));
  ASSERT_TRUE(peer.Send(GatedPush(t, 2, Op::kSparsePush), KeyAndGrad(2)));
  ASSERT_TRUE(WaitForStat(c, "requests", requests + 3));  // + this Stats call
  ASSERT_TRUE(WaitForStat(c, "parked_now", 1));
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (Stat(c, "held_behind_parked_now") < 1 && Stat(c, "log_last_seq") <= logged) {
    ASSERT_LT(std::chrono::steady_clock::now(), end);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A client's pushes are logged in its order. Its push-pull parked by the staleness gate (worker
// 0 at clock 1, worker 1 not yet there) holds its next push behind it: both are answered when
// the gate opens, push-pull first; and if the server dies meanwhile, neither is logged, so
// their resends apply. (The next push used to be logged at once; the dedup's mark then covered
// the parked push-pull, whose resend after a crash was answered "already applied" and lost.)
TEST(ExactlyOnceTest, APushBehindAParkedPushPullOfItsClientIsLoggedAfterIt) {
  // The two waiting requests fill the peer's slots: its Clocks, which take none, still go in.
  DurableServer server(GatedServerOptions({"--max_in_flight_per_peer=2"}));
  ASSERT_TRUE(server.Start());
  Client* c = server.client.get();
  const Table& t = server.table;
  testing::RawPeer peer(server.cluster.endpoints()[0]);
  SendPushPullThenPush(peer, c, t);
  EXPECT_EQ(Stat(c, "held_behind_parked_now"), 1);
  // Both workers reach clock 1 (requests 3 and 4 of the same peer): the gate opens.
  for (uint32_t w : {0u, 1u}) {
    Header clock;
    clock.op = Op::kClock;
    clock.worker_id = w;
    clock.num_workers = 2;
    clock.clock = 1;
    ASSERT_TRUE(peer.Send(clock));
  }
  std::vector<uint64_t> order;
  std::vector<float> pulled;
  for (int i = 0; i < 4; ++i) {
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(peer.socket(), std::back_inserter(reply)));
    Header r;
    ASSERT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
    EXPECT_EQ(r.status, StatusCode::kOk) << "request " << r.request_id << ": " << r.message;
    if (r.request_id <= 2) order.push_back(r.request_id);
    if (r.request_id == 1 && reply.size() == 2) {
      pulled.resize(kDim);
      std::memcpy(pulled.data(), reply[1].data(), std::min(reply[1].size(), kDim * sizeof(float)));
    }
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(pulled, std::vector<float>(kDim, -1.0f));
  EXPECT_EQ(Value(c, t, 1), -1.0f);
  EXPECT_EQ(Value(c, t, 2), -1.0f);
  EXPECT_EQ(Stat(c, "held_behind_parked_now"), 0);
  EXPECT_EQ(Stat(c, "held_behind_parked_total"), 1);
}

TEST(ExactlyOnceTest, AParkedPushPullAndThePushBehindItBothApplyAfterACrash) {
  DurableServer server(GatedServerOptions({}));
  ASSERT_TRUE(server.Start());
  Client* c = server.client.get();
  const Table& t = server.table;
  {
    testing::RawPeer peer(server.cluster.endpoints()[0]);
    SendPushPullThenPush(peer, c, t);
    server.cluster.Kill(0);
  }
  ASSERT_TRUE(server.cluster.Restart(0).ok());
  // The client's resends (here without the gate: the restarted server knows no clocks yet).
  testing::RawPeer again(server.cluster.endpoints()[0]);
  std::vector<float> values;
  EXPECT_EQ(PushRaw(again, t, 1, 1.0f, 1, Op::kSparsePushPull, &values).status, StatusCode::kOk);
  EXPECT_EQ(values, std::vector<float>(kDim, -1.0f));
  EXPECT_EQ(PushRaw(again, t, 2, 1.0f, 2).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, t, 1), -1.0f);
  EXPECT_EQ(Value(c, t, 2), -1.0f);
  EXPECT_EQ(Stat(c, "retried_pushes"), 0);
}

// Issue 35, item 12: a client pushes P, its reply is lost; more new clients than the dedup
// table holds in memory push once each; then P comes again. It is answered "already applied"
// (the table used to drop the least recently seen quarter, and P applied twice), also after a
// kill -9; a push whose client the server knows nowhere and that is not its first is refused
// Aborted, never applied blind. A cap of 64 (--push_dedup_max_clients) stands for the 65,536
// of the default, so that 640 clients do what 70,000 did.
TEST(ExactlyOnceTest, ARetryAfterMoreNewClientsThanTheDedupHoldsIsAnsweredAsApplied) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  o.extra_flags = {"--push_dedup_max_clients=64"};
  DurableServer server(o);
  ASSERT_TRUE(server.Start());
  LocalCluster& cluster = server.cluster;
  Client* c = server.client.get();
  const Table& t = server.table;
  const uint64_t key = 4242, other = 4343;
  testing::RawPeer peer(cluster.endpoints()[0]);
  ASSERT_EQ(PushRaw(peer, t, key, 1.0f, 1).status, StatusCode::kOk);  // P, applied

  // 640 clients of one push each: ten times the cap.
  for (uint64_t i = 0; i < 640; ++i) {
    Header h = testing::SparseHeader(Op::kSparsePush, t.id, 1, kDim);
    h.client_id = 0x100000 + i;
    h.client_seq = 1;
    const Header r = peer.Call(h, KeyAndGrad(other));
    ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  }
  EXPECT_EQ(Value(c, t, other), -640.0f);
  EXPECT_GT(Stat(c, "push_marks_spilled"), 0);
  EXPECT_LE(Stat(c, "push_marks_in_memory"), 64);

  // P again (the resend the proxy let through): answered OK, applied once.
  EXPECT_EQ(PushRaw(peer, t, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, t, key), -1.0f);
  EXPECT_EQ(Stat(c, "retried_pushes"), 1);

  // The spilled marks survive a kill -9.
  cluster.Kill(0);
  ASSERT_TRUE(cluster.Restart(0).ok());
  testing::RawPeer again(cluster.endpoints()[0]);
  EXPECT_EQ(PushRaw(again, t, key, 1.0f, 1).status, StatusCode::kOk);
  EXPECT_EQ(Value(c, t, key), -1.0f);
  EXPECT_EQ(Stat(c, "retried_pushes"), 1);
  EXPECT_EQ(PushRaw(again, t, key, 1.0f, 2).status, StatusCode::kOk);  // its next push applies
  EXPECT_EQ(Value(c, t, key), -2.0f);

  // A client known nowhere, with push 5: refused, nothing applied.
  Header h = testing::SparseHeader(Op::kSparsePush, t.id, 1, kDim);
  h.client_id = 0xabcdef;
  h.client_seq = 5;
  const Header r = again.Call(h, KeyAndGrad(key));
  EXPECT_EQ(r.status, StatusCode::kAborted) << r.message;
  EXPECT_EQ(Value(c, t, key), -2.0f);
  EXPECT_EQ(Stat(c, "unknown_client_pushes"), 1);
}

// A client whose mark the server forgot (not seen for --push_dedup_retention_s, then spilled
// past it) has its next push refused Aborted: the client library starts a new numbering under
// a new id and sends it again, so every push applies once and the caller sees OK.
TEST(ExactlyOnceTest, AClientWhoseMarkWasForgottenRenumbersItsPushes) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  o.extra_flags = {"--push_dedup_max_clients=1", "--push_dedup_retention_s=1"};
  DurableServer server(o);
  ASSERT_TRUE(server.Start());
  Client* c = server.client.get();
  const Table& t = server.table;
  const uint64_t key = 77;
  const std::vector<float> g(kDim, 1.0f);
  for (int i = 0; i < 3; ++i) {
    Status s = c->Wait(c->Push(t, std::span<const uint64_t>(&key, 1), g), DeadlineAfterMs(30000));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Past the retention, one other client pushes: the table spills (drops) the client's mark.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  testing::RawPeer peer(server.cluster.endpoints()[0]);
  Header h = testing::SparseHeader(Op::kSparsePush, t.id, 1, kDim);
  h.client_id = 0x77777;
  h.client_seq = 1;
  ASSERT_EQ(peer.Call(h, KeyAndGrad(key + 1)).status, StatusCode::kOk);
  for (int i = 0; i < 3; ++i) {
    Status s = c->Wait(c->Push(t, std::span<const uint64_t>(&key, 1), g), DeadlineAfterMs(30000));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(Value(c, t, key), -6.0f);
  EXPECT_EQ(Stat(c, "unknown_client_pushes"), 1);
}

TEST(ExactlyOnceTest, WithoutRetriesADeadServerFailsFast) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions co;
  co.servers = cluster.endpoints();
  co.retry_for_ms = 0;
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok());
  auto table = (*client)->CreateTable(TableSpec::Sparse("fast", kDim));
  ASSERT_TRUE(table.ok());
  cluster.Kill(0);
  const uint64_t key = 1;
  std::vector<float> out(kDim);
  Status s =
      (*client)->Wait((*client)->Pull(*table, std::span<const uint64_t>(&key, 1), out.data()),
                      DeadlineAfterMs(20000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

}  // namespace
}  // namespace tessera
