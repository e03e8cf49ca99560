// EtcdClient against a real etcd: keys, prefixes, transactions, leases, watches, and the
// errors of a missing or silent etcd.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>

#include "ps/coord/coordinator_url.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_F(EtcdTest, PutGetPrefixDelete) {
  const std::string binary("v\0\xff\n", 4);  // values are bytes, not text
  auto r1 = client_->Put("/t/a", binary);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  auto r2 = client_->Put("/t/b", "2");
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(*r2, *r1);
  ASSERT_TRUE(client_->Put("/t/c", "3").ok());
  ASSERT_TRUE(client_->Put("/t0", "outside").ok());  // the byte after '/' ends the prefix
  ASSERT_TRUE(client_->Put("/t/b", "2b").ok());

  auto a = client_->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, binary);
  EXPECT_EQ((*a)->mod_revision, *r1);
  EXPECT_EQ((*a)->version, 1);
  auto missing = client_->Get("/t/zz");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  auto range = client_->GetPrefix("/t/");
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  ASSERT_EQ(range->kvs.size(), 3u);
  EXPECT_EQ(range->kvs[0].key, "/t/a");
  EXPECT_EQ(range->kvs[1].key, "/t/b");
  EXPECT_EQ(range->kvs[1].value, "2b");
  EXPECT_EQ(range->kvs[1].version, 2);
  EXPECT_EQ(range->kvs[2].key, "/t/c");
  EXPECT_GE(range->revision, range->kvs[1].mod_revision);

  EXPECT_EQ(*client_->Delete("/t/a"), 1);
  EXPECT_EQ(*client_->Delete("/t/a"), 0);
  EXPECT_FALSE(client_->Get("/t/a")->has_value());
  EXPECT_EQ(*client_->DeletePrefix("/t/"), 2);
  EXPECT_TRUE(client_->GetPrefix("/t/")->kvs.empty());
  EXPECT_EQ((*client_->Get("/t0"))->value, "outside");
}

TEST_F(EtcdTest, TxnComparesAndSwaps) {
  // Create-if-absent: version 0 means no key.
  TxnRequest create;
  create.compares.push_back({"/k", TxnCompare::Target::kVersion, 0});
  create.success.push_back(TxnOp::Put("/k", "one"));
  create.failure.push_back(TxnOp::Get("/k"));
  auto c1 = client_->Txn(create);
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  EXPECT_TRUE(c1->succeeded);
  auto c2 = client_->Txn(create);
  ASSERT_TRUE(c2.ok());
  EXPECT_FALSE(c2->succeeded);
  ASSERT_EQ(c2->results.size(), 1u);
  ASSERT_EQ(c2->results[0].size(), 1u);
  EXPECT_EQ(c2->results[0][0].value, "one");

  const int64_t rev = c2->results[0][0].mod_revision;
  TxnRequest cas;
  cas.compares.push_back({"/k", TxnCompare::Target::kModRevision, rev});
  cas.success.push_back(TxnOp::Put("/k", "two"));
  cas.success.push_back(TxnOp::Get("/k"));
  auto s1 = client_->Txn(cas);
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  EXPECT_TRUE(s1->succeeded);
  ASSERT_EQ(s1->results.size(), 2u);
  EXPECT_TRUE(s1->results[0].empty());  // the put
  ASSERT_EQ(s1->results[1].size(), 1u);
  EXPECT_EQ(s1->results[1][0].value, "two");
  EXPECT_EQ(s1->results[1][0].mod_revision, s1->revision);

  // The same compare again is stale now: nothing changes.
  cas.success = {TxnOp::Put("/k", "three")};
  auto s2 = client_->Txn(cas);
  ASSERT_TRUE(s2.ok());
  EXPECT_FALSE(s2->succeeded);
  EXPECT_EQ((*client_->Get("/k"))->value, "two");
}

TEST_F(EtcdTest, LeaseGrantKeepAliveRevoke) {
  auto lease = client_->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_NE(lease->id, 0);
  EXPECT_EQ(lease->ttl_s, 30);
  ASSERT_TRUE(client_->Put("/leased", "x", lease->id).ok());
  EXPECT_EQ((*client_->Get("/leased"))->lease, lease->id);
  auto ttl = client_->KeepAlive(lease->id);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_EQ(*ttl, 30);
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  EXPECT_FALSE(client_->Get("/leased")->has_value());
  auto gone = client_->KeepAlive(lease->id);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().ToString();
  Status again = client_->RevokeLease(lease->id);
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_NE(again.message().find("requested lease not found"), std::string::npos)
      << again.ToString();
  EXPECT_NE(again.message().find("/v3/lease/revoke"), std::string::npos);
  // A put under a lease that does not exist is etcd's error, passed on.
  auto bad = client_->Put("/leased", "x", lease->id);
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound) << bad.status().ToString();
}

TEST_F(EtcdTest, CoordinatorUrlReachesThisEtcd) {
  auto url = CoordinatorUrl::Parse(etcd_.url("tessera/job1"));
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  auto client = EtcdClient::Create(url->etcd_options(2000));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Put(url->prefix + "/x", "1").ok());
  EXPECT_EQ((*client_->Get("/tessera/job1/x"))->value, "1");
}

// Collects a watch's events under a lock.
struct Seen {
  std::mutex mu;
  std::vector<WatchEvent> events;
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return events.size();
  }
  WatchCallback callback() {
    return [this](const WatchBatch& b) {
      std::lock_guard<std::mutex> lock(mu);
      events.insert(events.end(), b.events.begin(), b.events.end());
    };
  }
};

TEST_F(EtcdTest, WatchDeliversPutsAndDeletesInOrderAndStopsPromptly) {
  ASSERT_TRUE(client_->Put("/w/before", "0").ok());
  Seen seen;
  WatchOptions o;
  o.key = "/w/";
  o.prefix = true;
  auto watch = client_->Watch(o, seen.callback());
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*watch)->connects() == 1; }, seconds(30)));
  ASSERT_TRUE(client_->Put("/w/a", "1").ok());
  ASSERT_TRUE(client_->Put("/other", "x").ok());
  ASSERT_TRUE(client_->Put("/w/b", "2").ok());
  ASSERT_TRUE(client_->Delete("/w/a").ok());
  ASSERT_TRUE(WaitFor([&] { return seen.size() >= 3; }, seconds(30)))
      << (*watch)->last_error().ToString();
  {
    std::lock_guard<std::mutex> lock(seen.mu);
    ASSERT_EQ(seen.events.size(), 3u);  // not /w/before (older), not /other (outside)
    EXPECT_EQ(seen.events[0].kv.key, "/w/a");
    EXPECT_EQ(seen.events[0].kv.value, "1");
    EXPECT_EQ(seen.events[1].kv.key, "/w/b");
    EXPECT_EQ(seen.events[2].type, WatchEvent::Type::kDelete);
    EXPECT_EQ(seen.events[2].kv.key, "/w/a");
    EXPECT_LT(seen.events[0].kv.mod_revision, seen.events[1].kv.mod_revision);
    EXPECT_EQ((*watch)->next_revision(), seen.events[2].kv.mod_revision + 1);
  }
  // An idle stream is stopped by shutting its socket, not by waiting out a read timeout.
  const auto start = std::chrono::steady_clock::now();
  (*watch)->Stop();
  const double stop_ms = MsSince(start);
  EXPECT_LT(stop_ms, 5000) << "Stop waited for the stream's idle timeout";
  std::printf("watch stop: %.1f ms\n", stop_ms);
}

TEST_F(EtcdTest, WatchFromARevisionReplaysHistory) {
  auto first = client_->Put("/h", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put("/h", "2").ok());
  Seen seen;
  WatchOptions o;
  o.key = "/h";
  o.start_revision = *first;
  auto watch = client_->Watch(o, seen.callback());
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(WaitFor([&] { return seen.size() >= 2; }, seconds(30)));
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.events[0].kv.value, "1");
  EXPECT_EQ(seen.events[1].kv.value, "2");
}

TEST_F(EtcdTest, WatchReportsACompactionAndGoesOn) {
  auto first = client_->Put("/c", "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(client_->Put("/c", "2").ok());
  auto last = client_->Put("/c", "3");
  ASSERT_TRUE(last.ok());
  ASSERT_TRUE(client_->Compact(*last).ok());
  EXPECT_EQ(client_->Compact(*first).code(), StatusCode::kFailedPrecondition);
  std::mutex mu;
  std::vector<WatchBatch> batches;
  WatchOptions o;
  o.key = "/c";
  o.start_revision = *first;  // compacted away: the watch must say so, not go silent
  o.reconnect_backoff_ms = 20;
  auto watch = client_->Watch(o, [&](const WatchBatch& b) {
    std::lock_guard<std::mutex> lock(mu);
    batches.push_back(b);
  });
  ASSERT_TRUE(watch.ok());
  auto count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return batches.size();
  };
  ASSERT_TRUE(WaitFor([&] { return count() >= 2; }, seconds(30)))
      << (*watch)->last_error().ToString();  // the notice, then "3" from the compacted revision
  ASSERT_TRUE(client_->Put("/c", "4").ok());
  ASSERT_TRUE(WaitFor([&] { return count() >= 3; }, seconds(30)));
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(batches[0].compacted_to, *last);
  EXPECT_TRUE(batches[0].events.empty());
  ASSERT_EQ(batches[1].events.size(), 1u);
  EXPECT_EQ(batches[1].events[0].kv.value, "3");
  ASSERT_EQ(batches[2].events.size(), 1u);
  EXPECT_EQ(batches[2].events[0].kv.value, "4");
}

TEST(EtcdUnreachable, NothingListeningIsUnavailableAtOnce) {
  const uint16_t port = PickFreePort();  // free: nothing accepts there
  EtcdOptions o;
  o.port = port;
  o.timeout_ms = 2000;
  auto client = EtcdClient::Create(o);
  ASSERT_TRUE(client.ok());
  const auto start = std::chrono::steady_clock::now();
  auto r = (*client)->Get("/x");
  const double ms = MsSince(start);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  const std::string where = "etcd 127.0.0.1:" + std::to_string(port) + " /v3/kv/range";
  EXPECT_NE(r.status().message().find(where), std::string::npos) << r.status().ToString();
  EXPECT_LT(ms, 2 * o.timeout_ms);
  std::printf("refused: %.1f ms: %s\n", ms, r.status().ToString().c_str());
}

TEST(EtcdUnreachable, SilentPeerIsDeadlineExceededWithinTheTimeout) {
  // A socket that listens but never accepts: the kernel completes the connection and takes the
  // request, and no answer ever comes (a hung etcd).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  EtcdOptions o;
  o.port = ntohs(a.sin_port);
  o.timeout_ms = 500;
  auto client = EtcdClient::Create(o);
  ASSERT_TRUE(client.ok());
  const auto start = std::chrono::steady_clock::now();
  Status s = (*client)->Put("/x", "1").status();
  const double ms = MsSince(start);
  close(fd);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("/v3/kv/put"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("500 ms"), std::string::npos) << s.ToString();
  EXPECT_GE(ms, o.timeout_ms * 0.9);
  // The bound is per phase (connect, send, receive): at most about twice the timeout, plus
  // slack for a loaded machine.
  EXPECT_LT(ms, 2 * o.timeout_ms + 3000);
  std::printf("silent peer: %.1f ms: %s\n", ms, s.ToString().c_str());
}

TEST(EtcdUnreachable, BadOptionsAndUrlsAreRefusedSayingWhy) {
  EtcdOptions o;
  o.timeout_ms = 0;
  EXPECT_EQ(EtcdClient::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.host = "";
  EXPECT_EQ(EtcdClient::Create(o).status().code(), StatusCode::kInvalidArgument);
  auto url = CoordinatorUrl::Parse("etcd://127.0.0.1:2379");
  EXPECT_EQ(url.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(url.status().message().find("no /PREFIX"), std::string::npos)
      << url.status().ToString();
  url = CoordinatorUrl::Parse("zk://127.0.0.1:2181/p");
  EXPECT_NE(url.status().message().find("scheme must be etcd://"), std::string::npos);
}

}  // namespace
}  // namespace tessera::testing
