// A client's push that names a cluster map version ahead of the server's (the client saw the
// new map first) waits for the map on the server instead of being refused as stale
// (docs/wire-protocol.md, "Numbers across a stale-map refusal and a fail-over"). A refusal by
// a server behind the push's map proved nothing about an attempt of it still on its way: taken
// once the server caught up, it was applied a second time when the client, keeping its number
// counted in that server's sequence, sent it back there under another dedup key.
//
// An in-process server following maps the test sets (Server::SetClusterMap), real ZeroMQ
// sockets, pushes sent by hand with a client id and sequence number (tests/raw_peer.h).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/routing.h"
#include "ps/server/server.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;
using testing::Bytes;
using testing::RawPeer;

constexpr uint32_t kDim = 4;
constexpr uint64_t kClient = 0x3a9e11a5ULL;
const std::vector<uint64_t> kKeys = {11, 22, 33};

class MapAheadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.listen = "tcp://127.0.0.1:*";
    o.follow_cluster_map = true;
    o.maintenance_interval_ms = 50;
    auto s = Server::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->SetClusterMap(1, SlotMap::Uniform(1)).ok());
    ClientOptions co;
    co.servers = {server_->endpoint()};
    auto c = Client::Create(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    admin_ = std::move(*c);
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;  // zeros initializer: a row reads minus the sum of its gradients
    auto t = admin_->CreateTable(TableSpec::Sparse("emb", kDim, sgd));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    table_ = *t;
    peer_ = std::make_unique<RawPeer>(server_->endpoint());
  }

  // Push `seq` of kClient (gradient `g` on every element of kKeys), routed by map `version`.
  Header PushHeader(uint64_t seq, uint64_t version) const {
    Header h = testing::SparseHeader(Op::kSparsePush, table_.id, kKeys.size(), kDim);
    h.client_id = kClient;
    h.client_seq = seq;
    h.map_version = version;
    return h;
  }
  static std::vector<std::string> PushData(float g) {
    return {Bytes(kKeys), Bytes(std::vector<float>(kKeys.size() * kDim, g))};
  }

  // The next reply on the peer's socket within `limit` (nullopt: none came).
  std::optional<Header> NextReply(milliseconds limit) { return peer_->NextReply(limit); }

  // Every element of kKeys' rows, read at map `version`.
  std::vector<float> Rows(uint64_t version) {
    Header h = testing::SparseHeader(Op::kSparsePull, table_.id, kKeys.size(), kDim);
    h.map_version = version;
    std::vector<std::string> data;
    const Header r = peer_->Call(h, {Bytes(kKeys)}, &data);
    EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
    if (data.size() != 1) return {};
    std::vector<float> out(data[0].size() / sizeof(float));
    std::memcpy(out.data(), data[0].data(), data[0].size());
    return out;
  }

  int64_t Stat(const std::string& name) {
    auto st = admin_->ServerStats(0);
    return st.ok() ? testing::StatValue(*st, name) : -1;
  }
  // Stat `name` once it reads `want` (the peer's requests reach the server on their own
  // connection, in their own time), or its last value after 10 s.
  int64_t StatOnceAt(const std::string& name, int64_t want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int64_t v = Stat(name);
    while (v != want && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
      v = Stat(name);
    }
    return v;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> admin_;
  Table table_;
  std::unique_ptr<RawPeer> peer_;
};

// Push 1 names map 2 while the server is at 1: it waits (no answer), a resend of it (same
// request) is dropped, and push 2 of the client waits behind it. Map 2 comes: both are applied,
// once each, and answered; push 1 sent again later is answered as a retry.
TEST_F(MapAheadTest, APushAheadOfTheServersMapWaitsForItAndIsAppliedOnce) {
  ASSERT_TRUE(peer_->Resend(PushHeader(1, 2), /*request_id=*/101, PushData(1.0f)));
  const std::optional<Header> early = NextReply(milliseconds(300));
  ASSERT_FALSE(early.has_value()) << "answered before its map came: "
                                  << static_cast<int>(early->status) << " " << early->message;
  EXPECT_EQ(StatOnceAt("map_wait_now", 1), 1);
  ASSERT_TRUE(peer_->Resend(PushHeader(1, 2), 101, PushData(1.0f)));  // the client's resend
  ASSERT_TRUE(peer_->Resend(PushHeader(2, 2), 102, PushData(10.0f)));
  ASSERT_EQ(StatOnceAt("map_wait_resends_dropped", 1), 1);
  EXPECT_EQ(StatOnceAt("map_wait_now", 2), 2);
  EXPECT_FALSE(NextReply(milliseconds(100)).has_value());

  ASSERT_TRUE(server_->SetClusterMap(2, SlotMap::Uniform(1)).ok());
  std::vector<uint64_t> answered;
  for (int i = 0; i < 2; ++i) {
    const std::optional<Header> r = NextReply(milliseconds(10000));
    ASSERT_TRUE(r.has_value()) << "push " << (answered.empty() ? 1 : 2) << " never answered";
    EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
    answered.push_back(r->request_id);
  }
  EXPECT_EQ(answered, (std::vector<uint64_t>{101, 102})) << "answered once each, in order";
  EXPECT_FALSE(NextReply(milliseconds(200)).has_value()) << "a second answer to the resend";
  for (float v : Rows(2)) ASSERT_EQ(v, -11.0f) << "pushes 1 and 2, once each";

  const Header again = peer_->Call(PushHeader(1, 2), PushData(1.0f));
  EXPECT_EQ(again.status, StatusCode::kOk) << again.message;
  EXPECT_EQ(Stat("retried_pushes"), 1);
  for (float v : Rows(2)) ASSERT_EQ(v, -11.0f) << "the retry applied again";
  EXPECT_EQ(Stat("map_wait_now"), 0);
  EXPECT_EQ(Stat("map_wait_total"), 2);
}

// A worker's Clock sent after its held push on the same connection waits behind it: it ends
// that push's step (a checkpoint cut and the staleness bound go by it), so the server must not
// count it before the push is applied.
TEST_F(MapAheadTest, AClockAfterAHeldPushWaitsBehindIt) {
  ASSERT_TRUE(peer_->Resend(PushHeader(1, 2), /*request_id=*/301, PushData(1.0f)));
  Header clock;
  clock.op = Op::kClock;
  clock.clock = 5;
  clock.worker_id = 0;
  clock.num_workers = 1;
  ASSERT_TRUE(peer_->Resend(clock, 302));
  const std::optional<Header> early = NextReply(milliseconds(300));
  ASSERT_FALSE(early.has_value()) << "request " << early->request_id << " answered first";
  ASSERT_EQ(StatOnceAt("map_wait_now", 2), 2) << "the push and its Clock are not both held";
  EXPECT_NE(Stat("max_clock"), 5) << "the Clock was counted before the push of its step";
  ASSERT_TRUE(server_->SetClusterMap(2, SlotMap::Uniform(1)).ok());
  for (uint64_t id : {301, 302}) {
    const std::optional<Header> r = NextReply(milliseconds(10000));
    ASSERT_TRUE(r.has_value()) << "request " << id << " never answered";
    EXPECT_EQ(r->request_id, id) << "answered out of order";
    EXPECT_EQ(r->status, StatusCode::kOk) << r->message;
  }
  EXPECT_EQ(Stat("max_clock"), 5);
  for (float v : Rows(2)) ASSERT_EQ(v, -1.0f);
}

// A push of a version the store never had is refused by its version, as before, once a read of
// the store after it came found an older newest map; nothing of it was applied, and its
// number is taken by the next push.
TEST_F(MapAheadTest, APushAheadOfTheStoresNewestMapIsRefusedByItsVersion) {
  ASSERT_TRUE(server_->SetClusterMapLoader([]() -> Result<RoutingMap> {
                RoutingMap m;
                m.version = 1;
                m.primary = SlotMap::Uniform(1);
                return m;
              }).ok());
  const Header r = peer_->Call(PushHeader(1, 7), PushData(1.0f));
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("still at 1"), std::string::npos) << r.message;
  EXPECT_EQ(r.map_version, 1u);
  const Header next = peer_->Call(PushHeader(1, 1), PushData(5.0f));
  EXPECT_EQ(next.status, StatusCode::kOk) << next.message;
  for (float v : Rows(1)) ASSERT_EQ(v, -5.0f) << "only the second push 1 applied";
}

// A push whose map does not come within MapWait::kHoldLimit is answered Unavailable with the
// later one of its client; its number stays free: the client's later push sent before its
// resend waits for it, and both apply once when they come again in order.
TEST_F(MapAheadTest, APushWhoseMapNeverComesIsGivenUpAndItsNumberStaysFree) {
  ASSERT_TRUE(peer_->Resend(PushHeader(1, 2), 201, PushData(1.0f)));
  ASSERT_TRUE(peer_->Resend(PushHeader(2, 1), 202, PushData(10.0f)));  // behind it
  for (uint64_t id : {201, 202}) {
    const std::optional<Header> r = NextReply(milliseconds(30000));
    ASSERT_TRUE(r.has_value()) << "request " << id << " never answered";
    EXPECT_EQ(r->request_id, id);
    EXPECT_EQ(r->status, StatusCode::kUnavailable) << r->message;
  }
  EXPECT_EQ(StatOnceAt("map_wait_expired", 2), 2);
  // Push 2 again before push 1: it waits for 1 (the gap), then both go.
  Header r = peer_->Call(PushHeader(2, 1), PushData(10.0f));
  EXPECT_EQ(r.status, StatusCode::kUnavailable) << r.message;
  ASSERT_TRUE(server_->SetClusterMap(2, SlotMap::Uniform(1)).ok());
  r = peer_->Call(PushHeader(1, 2), PushData(1.0f));
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  r = peer_->Call(PushHeader(2, 2), PushData(10.0f));
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  for (float v : Rows(2)) ASSERT_EQ(v, -11.0f) << "pushes 1 and 2, once each";
}

}  // namespace
}  // namespace tessera
