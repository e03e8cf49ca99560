// The client's side of a fail-over (docs/elasticity.md, "Replication and fail-over"): a cluster
// map that retires a server id whose backup took its slots. What was in flight to the retired
// server goes to the new owner, a push under the number it had there (client_id, client_seq,
// client_origin = old server + 1) so that the new owner, which may hold it from the old
// primary's replication, applies it once; a dense request to it fails at once. The servers are
// raw ZeroMQ ROUTER sockets whose answers each test decides (a real server would need
// replication to be tested this way), and the map comes from an in-memory ClusterMapSource.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "ps/client/client.h"
#include "ps/cluster_map_source.h"
#include "ps/codec.h"
#include "ps/routing.h"
#include "ps/table_spec.h"

namespace tessera {
namespace {

using std::chrono::milliseconds;

// One request a FakeServer received.
struct Received {
  Header h;
  std::vector<std::string> frames;
};

// A ROUTER on a free loopback port that answers pings itself and every other request as
// `policy` says (default: OK; a pull gets, per key, `dim` floats of PullValue(server, key)).
class FakeServer {
 public:
  // Fills `reply` (status, map_version; request_id and op are set already) and its data
  // frames; false: no answer at all (a dead primary).
  using Policy = std::function<bool(const Received& req, Header* reply,
                                    std::vector<std::string>* frames)>;

  explicit FakeServer(uint32_t id) : id_(id), sock_(ctx_, zmq::socket_type::router) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.bind("tcp://127.0.0.1:*");
    endpoint_ = sock_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeServer() {
    stop_.store(true);
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  void SetPolicy(Policy p) {
    std::lock_guard<std::mutex> l(mu_);
    policy_ = std::move(p);
  }
  // The requests of `op` received so far.
  std::vector<Received> Of(Op op) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Received> v;
    for (const auto& r : received_) {
      if (r.h.op == op) v.push_back(r);
    }
    return v;
  }
  // Waits until `n` requests of `op` arrived; false after `ms`.
  bool WaitFor(Op op, size_t n, int ms = 5000) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, milliseconds(ms), [&] {
      size_t c = 0;
      for (const auto& r : received_) c += r.h.op == op ? 1 : 0;
      return c >= n;
    });
  }
  static float PullValue(uint32_t server, uint64_t key) {
    return static_cast<float>(server * 1000 + key % 1000);
  }

 private:
  void Loop() {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    while (!stop_.load()) {
      zmq::poll(&item, 1, milliseconds(10));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> parts;
      if (!zmq::recv_multipart(sock_, std::back_inserter(parts), zmq::recv_flags::dontwait) ||
          parts.size() < 2) {
        continue;
      }
      Received req;
      if (!DecodeHeader(parts[1].data(), parts[1].size(), &req.h).ok()) continue;
      for (size_t i = 2; i < parts.size(); ++i) req.frames.push_back(parts[i].to_string());
      Header reply;
      reply.request_id = req.h.request_id;
      reply.op = req.h.op;
      std::vector<std::string> frames;
      bool answer = true;
      if (req.h.op != Op::kPing) {
        Policy policy;
        {
          std::lock_guard<std::mutex> l(mu_);
          received_.push_back(req);
          policy = policy_;
        }
        cv_.notify_all();
        answer = policy ? policy(req, &reply, &frames) : DefaultReply(req, &reply, &frames);
      }
      if (!answer) continue;
      std::string env;
      EncodeHeader(reply, &env);
      std::vector<zmq::message_t> out;
      out.emplace_back(parts[0].data(), parts[0].size());
      out.emplace_back(env.data(), env.size());
      for (auto& f : frames) out.emplace_back(f.data(), f.size());
      zmq::send_multipart(sock_, out, zmq::send_flags::dontwait);
    }
  }

 public:
  bool DefaultReply(const Received& req, Header* reply, std::vector<std::string>* frames) const {
    reply->count = req.h.count;
    if (req.h.op == Op::kSparsePull || req.h.op == Op::kSparsePushPull) {
      std::vector<float> rows;
      const auto* keys = reinterpret_cast<const uint64_t*>(req.frames[0].data());
      for (uint64_t k = 0; k < req.h.count; ++k) {
        for (uint32_t j = 0; j < req.h.dim; ++j) rows.push_back(PullValue(id_, keys[k]));
      }
      frames->emplace_back(reinterpret_cast<const char*>(rows.data()),
                           rows.size() * sizeof(float));
    } else if (req.h.op == Op::kDensePull) {
      frames->emplace_back(std::string(req.h.count * sizeof(float), '\0'));
    }
    return true;
  }

 private:
  const uint32_t id_;
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Received> received_;  // guarded by mu_
  Policy policy_;                   // guarded by mu_
};

// A ClusterMapSource over maps the test publishes: Load gives the latest, Watch delivers each
// one published after it (on the publishing thread).
class MemoryMapSource final : public ClusterMapSource {
 public:
  explicit MemoryMapSource(RoutingMap first) : latest_(std::move(first)) {}
  Result<RoutingMap> Load() override {
    std::lock_guard<std::mutex> l(mu_);
    return latest_;
  }
  Status Watch(RoutingMapCallback callback) override {
    std::lock_guard<std::mutex> l(mu_);
    if (callback_) return Status::FailedPrecondition("a second watch");
    callback_ = std::move(callback);
    callback_(latest_);
    return Status::OK();
  }
  // Makes `m` the latest map and delivers it to the watch (held under the lock, so that the
  // source's destruction waits for a delivery under way).
  void Publish(RoutingMap m) {
    std::lock_guard<std::mutex> l(mu_);
    latest_ = m;
    if (callback_) callback_(m);
  }

 private:
  std::mutex mu_;
  RoutingMap latest_;
  RoutingMapCallback callback_;
};

RoutingMap MapOf(uint64_t version, std::vector<std::string> addresses,
                 std::vector<uint16_t> owners, uint32_t dense_servers) {
  RoutingMap m;
  m.version = version;
  const uint32_t n = static_cast<uint32_t>(addresses.size());
  m.addresses = std::move(addresses);
  m.primary = *SlotMap::FromOwners(std::move(owners), n);
  m.dense_servers = dense_servers;
  return m;
}

// `from`'s slots given to `to` (to[i] gets the i-th contiguous share of them).
std::vector<uint16_t> Reassign(const std::vector<uint16_t>& owners, uint16_t from,
                               const std::vector<uint16_t>& to) {
  std::vector<uint32_t> slots;
  for (uint32_t s = 0; s < kNumSlots; ++s) {
    if (owners[s] == from) slots.push_back(s);
  }
  std::vector<uint16_t> out = owners;
  for (size_t i = 0; i < slots.size(); ++i) out[slots[i]] = to[i * to.size() / slots.size()];
  return out;
}

// Keys whose slot `map` gives `server`, `n` of them (with `pred` on the slot, if given).
std::vector<uint64_t> KeysOf(const SlotMap& map, uint32_t server, size_t n,
                             const std::function<bool(uint32_t)>& pred = nullptr) {
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < n; ++k) {
    if (map.ServerOfKey(k) == server && (!pred || pred(SlotOfKey(k)))) keys.push_back(k);
  }
  return keys;
}

bool Silent(const Received&, Header*, std::vector<std::string>*) { return false; }

class ClientFailover : public ::testing::Test {
 protected:
  // `n` fake servers, the first map uniform over them (version 1) with backups (server 0's
  // slots backed up by `backup_of_0`, as Retire0 shares them out; the others by the next
  // server), and a client of it.
  void Start(uint32_t n, const std::vector<uint16_t>& backup_of_0 = {1},
             int64_t request_timeout_ms = 30000) {
    std::vector<std::string> addresses;
    for (uint32_t i = 0; i < n; ++i) {
      servers_.push_back(std::make_unique<FakeServer>(i));
      addresses.push_back(servers_.back()->endpoint());
    }
    v1_ = MapOf(1, addresses, SlotMap::Uniform(n).owners(), n);
    // A promotion gives a dead primary's slots to their backups: the client tells it from a
    // move by that (ClientImpl::FailedOver).
    const std::vector<uint16_t>& owners = v1_.primary.owners();
    const std::vector<uint16_t> of_0 = Reassign(owners, 0, backup_of_0);
    v1_.backup.resize(kNumSlots);
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      v1_.backup[slot] = owners[slot] == 0 ? of_0[slot] : static_cast<uint16_t>((owners[slot] + 1) % n);
    }
    auto source = std::make_unique<MemoryMapSource>(v1_);
    source_ = source.get();
    ClientOptions o;
    o.request_timeout_ms = request_timeout_ms;  // default: no retry by timeout within a test
    o.retry_for_ms = 60000;
    auto c = Client::Create(o, std::move(source));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();  // before the servers and the source it points into
    servers_.clear();
  }
  // The map after `v1_`'s server 0 died: its id retired, its slots given to `to`.
  RoutingMap Retire0(uint64_t version, const std::vector<uint16_t>& to) {
    RoutingMap m = v1_;
    m.version = version;
    m.addresses[0] = "";
    m.primary = *SlotMap::FromOwners(Reassign(v1_.primary.owners(), 0, to),
                                     static_cast<uint32_t>(m.addresses.size()));
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      // Promoted slots have no backup; a backup that was server 0 is gone.
      if (v1_.primary.ServerOfSlot(slot) == 0 || m.backup[slot] == 0) {
        m.backup[slot] = RoutingMap::kNoBackup;
      }
    }
    return m;
  }
  // Pushes `times` times to keys of `server` (answered): the client's sequence there moves
  // on, so that a push given a new number there would not get its old one by chance.
  void AdvanceSequence(const Table& t, uint32_t server, int times) {
    const std::vector<uint64_t> keys = KeysOf(v1_.primary, server, 2);
    for (int i = 0; i < times; ++i) {
      ASSERT_TRUE(client_
                      ->Wait(client_->Push(t, keys, std::vector<float>(keys.size() * t.spec.dim)),
                             DeadlineAfterMs(5000))
                      .ok());
    }
  }
  static Table Sparse(uint32_t dim) {
    return Table{TableIdForName("emb"), TableSpec::Sparse("emb", dim)};
  }

  std::vector<std::unique_ptr<FakeServer>> servers_;
  RoutingMap v1_;
  MemoryMapSource* source_ = nullptr;  // owned by client_
  std::unique_ptr<Client> client_;
};

TEST_F(ClientFailover, PushInFlightToARetiredPrimaryGoesToTheNewOwnerUnderItsNumber) {
  Start(2);
  servers_[0]->SetPolicy(Silent);  // dead: takes requests, never answers
  const Table t = Sparse(2);
  AdvanceSequence(t, 1, 2);  // server 1's numbers 1 and 2
  const std::vector<uint64_t> keys = KeysOf(v1_.primary, 0, 5);
  const std::vector<float> grads(keys.size() * 2, 0.5f);
  Handle push = client_->Push(t, keys, grads);
  std::vector<float> out(keys.size() * 2, -1.0f);
  Handle pull = client_->Pull(t, keys, out.data());
  ASSERT_TRUE(servers_[0]->WaitFor(Op::kSparsePull, 1));
  const Received first = servers_[0]->Of(Op::kSparsePush).at(0);
  EXPECT_NE(first.h.client_id, 0u);
  EXPECT_EQ(first.h.client_seq, 1u);
  EXPECT_EQ(first.h.client_origin, 0u);

  source_->Publish(Retire0(2, {1}));
  EXPECT_TRUE(client_->Wait(push, DeadlineAfterMs(5000)).ok());
  ASSERT_TRUE(client_->Wait(pull, DeadlineAfterMs(5000)).ok());
  std::vector<Received> got = servers_[1]->Of(Op::kSparsePush);
  ASSERT_EQ(got.size(), 3u);
  got.erase(got.begin(), got.begin() + 2);
  EXPECT_EQ(got[0].h.client_id, first.h.client_id);
  EXPECT_EQ(got[0].h.client_seq, first.h.client_seq);
  EXPECT_EQ(got[0].h.client_origin, 1u);  // counted in server 0's sequence
  EXPECT_EQ(got[0].h.map_version, 2u);
  EXPECT_EQ(got[0].frames, first.frames);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(out[2 * i], FakeServer::PullValue(1, keys[i])) << i;
  }

  // Later pushes take server 1's own numbers (the rerouted push took none); nothing goes to
  // the retired id again, and a clock is not held up by it.
  ASSERT_TRUE(client_->Wait(client_->Push(t, keys, grads), DeadlineAfterMs(5000)).ok());
  ASSERT_TRUE(client_->Wait(client_->Clock(), DeadlineAfterMs(5000)).ok());
  const std::vector<Received> later = servers_[1]->Of(Op::kSparsePush);
  ASSERT_EQ(later.size(), 4u);
  EXPECT_EQ(later[3].h.client_origin, 0u);
  EXPECT_EQ(later[3].h.client_seq, 3u);
  EXPECT_EQ(servers_[0]->Of(Op::kSparsePush).size(), 1u);
  EXPECT_EQ(servers_[0]->Of(Op::kClock).size(), 0u);
}

// A retired id given back (a restarted server registered again, `tessera-ctl scale` gave it
// its id) gets a new push numbering: the pushes of its last stay that were sent again to the
// slots' new owners are known there under (numbering, that id), and the backup of its new
// process would get its pushes forwarded under the same key. Numbered on, a later push
// forwarded so put the mark above one of them still on its way, whose resend was then answered
// as a retry and applied nowhere (ReplicatedRandomFaults.FailOverRebuildAndScale, seed
// 2466295921).
TEST_F(ClientFailover, AnIdGivenBackGetsANewPushNumbering) {
  // The default request timeout (30 s), and waits of 10 s: a push sent while the client
  // connected anew to the id given back went down the old connection, still closing, and
  // waited one request timeout (2-5 runs in 16 at a load of 4 timed out a 5 s wait); it now
  // waits for the new connection (ServerConn::reconnecting).
  Start(2);
  const Table t = Sparse(2);
  AdvanceSequence(t, 0, 2);  // server 0's numbers 1 and 2
  const Received before = servers_[0]->Of(Op::kSparsePush).at(1);
  ASSERT_EQ(before.h.client_seq, 2u);
  source_->Publish(Retire0(2, {1}));
  const std::vector<uint64_t> keys = KeysOf(v1_.primary, 0, 2);
  const std::vector<float> grads(keys.size() * 2, 0.5f);
  // Routed to server 1 until the client handled the retirement and took the map that gives
  // the id back.
  RoutingMap v3 = v1_;
  v3.version = 3;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (servers_[0]->Of(Op::kSparsePush).size() == 2 && std::chrono::steady_clock::now() < end) {
    source_->Publish(v3);
    ASSERT_TRUE(client_->Wait(client_->Push(t, keys, grads), DeadlineAfterMs(10000)).ok());
  }
  const std::vector<Received> got = servers_[0]->Of(Op::kSparsePush);
  ASSERT_EQ(got.size(), 3u) << "the client never sent to the id given back";
  EXPECT_EQ(got[2].h.client_seq, 1u);
  EXPECT_NE(got[2].h.client_id, before.h.client_id);
  EXPECT_NE(got[2].h.client_id, 0u);
  EXPECT_EQ(got[2].h.client_origin, 0u);
  // The numbering goes on from there.
  ASSERT_TRUE(client_->Wait(client_->Push(t, keys, grads), DeadlineAfterMs(10000)).ok());
  const std::vector<Received> next = servers_[0]->Of(Op::kSparsePush);
  ASSERT_EQ(next.size(), 4u);
  EXPECT_EQ(next[3].h.client_seq, 2u);
  EXPECT_EQ(next[3].h.client_id, got[2].h.client_id);
}

TEST_F(ClientFailover, ASplitPushKeepsItsNumberInEveryPiece) {
  Start(3, {1, 2});
  servers_[0]->SetPolicy(Silent);
  const Table t = Sparse(1);
  AdvanceSequence(t, 1, 2);
  AdvanceSequence(t, 2, 3);
  // Server 0's slots go half to server 1, half to server 2: keys from both halves.
  const RoutingMap v2 = Retire0(2, {1, 2});
  std::vector<uint64_t> keys = KeysOf(v1_.primary, 0, 3, [&](uint32_t s) {
    return v2.primary.ServerOfSlot(s) == 1;
  });
  for (uint64_t k : KeysOf(v1_.primary, 0, 3,
                           [&](uint32_t s) { return v2.primary.ServerOfSlot(s) == 2; })) {
    keys.insert(keys.begin() + 1, k);  // interleaved
  }
  const std::vector<float> grads(keys.size(), 1.0f);
  std::vector<float> out(keys.size(), -1.0f);
  Handle push_pull = client_->PushPull(t, keys, grads, out.data());
  ASSERT_TRUE(servers_[0]->WaitFor(Op::kSparsePushPull, 1));
  const Received first = servers_[0]->Of(Op::kSparsePushPull).at(0);

  source_->Publish(v2);
  ASSERT_TRUE(client_->Wait(push_pull, DeadlineAfterMs(5000)).ok());
  uint64_t count = 0;
  for (uint32_t s : {1u, 2u}) {
    const std::vector<Received> got = servers_[s]->Of(Op::kSparsePushPull);
    ASSERT_EQ(got.size(), 1u) << "server " << s;
    EXPECT_EQ(got[0].h.client_id, first.h.client_id);
    EXPECT_EQ(got[0].h.client_seq, first.h.client_seq);
    EXPECT_EQ(got[0].h.client_origin, 1u);
    count += got[0].h.count;
  }
  EXPECT_EQ(count, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(out[i], FakeServer::PullValue(v2.primary.ServerOfKey(keys[i]), keys[i])) << i;
  }
}

TEST_F(ClientFailover, ARefusedPushCountedInARetiredSequenceKeepsItsNumber) {
  Start(3);
  servers_[0]->SetPolicy(Silent);
  // Server 1 has seen a newer map (version 3) by the time the push reaches it.
  servers_[1]->SetPolicy([](const Received& r, Header* reply, std::vector<std::string>*) {
    if (r.h.op == Op::kSparsePush) {
      reply->status = StatusCode::kFailedPrecondition;
      reply->message = "stale cluster map: request has version 2, server 1 is at 3; nothing "
                       "of it was applied";
      reply->map_version = 3;
    }
    return true;
  });
  const Table t = Sparse(1);
  AdvanceSequence(t, 2, 2);
  const std::vector<uint64_t> keys = KeysOf(v1_.primary, 0, 4);
  Handle push = client_->Push(t, keys, std::vector<float>(keys.size(), 1.0f));
  ASSERT_TRUE(servers_[0]->WaitFor(Op::kSparsePush, 1));
  const Received first = servers_[0]->Of(Op::kSparsePush).at(0);
  source_->Publish(Retire0(2, {1}));
  ASSERT_TRUE(servers_[1]->WaitFor(Op::kSparsePush, 1));
  // Version 3 gives server 0's slots to server 2 instead.
  source_->Publish(Retire0(3, {2}));
  ASSERT_TRUE(client_->Wait(push, DeadlineAfterMs(5000)).ok());
  std::vector<Received> got = servers_[2]->Of(Op::kSparsePush);
  ASSERT_EQ(got.size(), 3u);
  got.erase(got.begin(), got.begin() + 2);
  EXPECT_EQ(got[0].h.map_version, 3u);
  EXPECT_EQ(got[0].h.client_id, first.h.client_id);
  EXPECT_EQ(got[0].h.client_seq, first.h.client_seq);
  EXPECT_EQ(got[0].h.client_origin, 1u);
  EXPECT_EQ(client_->stale_map_retries(), 1u);
}

// A push whose first attempt went unanswered (timed out) and whose resend is refused as stale
// (docs/wire-protocol.md, "Numbers across a stale-map refusal and a fail-over"): by a server
// ahead of the push's map over the same connection, the refusal covers every attempt, and the
// push gets a new number; by a server behind the push's map, the first attempt may still be
// taken there, and the push keeps its number, counted in that server's sequence.
TEST_F(ClientFailover, AnUnansweredPushRefusedAsStaleKeepsItsNumberUnlessTheRefusalCoversIt) {
  Start(2, {1}, /*request_timeout_ms=*/500);
  const Table t = Sparse(1);
  // Server 1 does not answer a push's first attempt and refuses the second as stale, the reply
  // at `refusal_version`; it takes the push when it comes again (rerouted). Returns the three
  // attempts.
  auto push_refused_at = [&](uint64_t refusal_version) {
    auto attempts = std::make_shared<std::atomic<int>>(0);
    servers_[1]->SetPolicy([=](const Received& r, Header* reply, std::vector<std::string>*) {
      if (r.h.op != Op::kSparsePush) return true;
      const int n = attempts->fetch_add(1);
      if (n == 0) return false;
      if (n == 1) {
        reply->status = StatusCode::kFailedPrecondition;
        reply->message = "stale cluster map (test)";
        reply->map_version = refusal_version;
      }
      return true;
    });
    const size_t before = servers_[1]->Of(Op::kSparsePush).size();
    const std::vector<uint64_t> keys = KeysOf(v1_.primary, 1, 3);
    Handle h = client_->Push(t, keys, std::vector<float>(keys.size(), 1.0f));
    if (refusal_version > client_->cluster_map_version()) {
      // The client waits for the server's map: the same owners at that version.
      EXPECT_TRUE(servers_[1]->WaitFor(Op::kSparsePush, before + 2));
      RoutingMap next = v1_;
      next.version = refusal_version;
      source_->Publish(next);
    }
    const Status s = client_->Wait(h, DeadlineAfterMs(10000));
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<Received> got = servers_[1]->Of(Op::kSparsePush);
    EXPECT_EQ(got.size(), before + 3);
    got.erase(got.begin(), got.begin() + std::min(before, got.size()));
    return got;
  };
  {
    SCOPED_TRACE("a server ahead of the push, over the same connection: every attempt refused");
    const std::vector<Received> got = push_refused_at(2);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[1].h.client_seq, got[0].h.client_seq);  // the timed-out attempt again
    EXPECT_EQ(got[2].h.client_origin, 0u);
    EXPECT_GT(got[2].h.client_seq, got[0].h.client_seq) << "not renumbered";
    EXPECT_EQ(got[2].h.map_version, 2u);
  }
  {
    SCOPED_TRACE("a server behind the push: the first attempt may still be taken there");
    const std::vector<Received> got = push_refused_at(1);  // the client is at 2
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[2].h.client_origin, 2u) << "renumbered: not counted in server 1's sequence";
    EXPECT_EQ(got[2].h.client_id, got[0].h.client_id);
    EXPECT_EQ(got[2].h.client_seq, got[0].h.client_seq);
    // The next push to server 1 starts a new numbering there: numbered on, it could put a
    // backup's mark for (client id, origin 2) above the kept push (docs/wire-protocol.md).
    servers_[1]->SetPolicy(nullptr);
    const std::vector<uint64_t> keys = KeysOf(v1_.primary, 1, 2);
    ASSERT_TRUE(client_->Wait(client_->Push(t, keys, std::vector<float>(keys.size(), 1.0f)),
                              DeadlineAfterMs(10000))
                    .ok());
    const Received next = servers_[1]->Of(Op::kSparsePush).back();
    EXPECT_EQ(next.h.client_origin, 0u);
    EXPECT_NE(next.h.client_id, got[0].h.client_id) << "numbered on in the kept push's numbering";
    EXPECT_EQ(next.h.client_seq, 1u);
  }
}

// A backup rebuild or a slot move steps the map through many versions in a second or two (24 in
// FailoverTest's rebuild of 10,923 slots), and a request in flight may be refused by each of
// them in turn. Each refusal shows a newer map than the last: progress, bounded by retry_for_ms
// only, not by a count of reroutes (docs/elasticity.md). Here server 1 refuses a push and a pull
// 24 times each (the old bound was 8), each time at one version past the request's, and the map
// source publishes that version (same owners) before the refusal goes out.
TEST_F(ClientFailover, RequestsRideThroughAMapSteppingThroughManyVersions) {
  Start(2);
  constexpr uint32_t kRefusals = 24;
  auto refused = std::make_shared<std::atomic<uint32_t>>(0);
  servers_[1]->SetPolicy([this, refused](const Received& r, Header* reply,
                                        std::vector<std::string>* frames) {
    if (refused->load() < kRefusals) {
      refused->fetch_add(1);
      RoutingMap next = v1_;
      next.version = r.h.map_version + 1;
      source_->Publish(next);
      reply->status = StatusCode::kFailedPrecondition;
      reply->message = "stale cluster map (test): request has version " +
                       std::to_string(r.h.map_version) + ", server 1 is at " +
                       std::to_string(next.version);
      reply->map_version = next.version;
      return true;
    }
    return servers_[1]->DefaultReply(r, reply, frames);
  });
  const Table t = Sparse(2);
  const std::vector<uint64_t> keys = KeysOf(v1_.primary, 1, 4);
  const Status pushed =
      client_->Wait(client_->Push(t, keys, std::vector<float>(keys.size() * 2, 1.0f)),
                    DeadlineAfterMs(30000));
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  std::vector<Received> got = servers_[1]->Of(Op::kSparsePush);
  ASSERT_EQ(got.size(), kRefusals + 1);
  for (uint32_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].h.map_version, i + 1) << "attempt " << i;
    EXPECT_EQ(got[i].frames, got[0].frames) << "attempt " << i;
  }
  EXPECT_EQ(client_->cluster_map_version(), kRefusals + 1);

  refused->store(0);
  std::vector<float> out(keys.size() * 2, -1.0f);
  const Status pulled = client_->Wait(client_->Pull(t, keys, out.data()), DeadlineAfterMs(30000));
  ASSERT_TRUE(pulled.ok()) << pulled.ToString();
  EXPECT_EQ(servers_[1]->Of(Op::kSparsePull).size(), kRefusals + 1);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(out[2 * i], FakeServer::PullValue(1, keys[i])) << i;
  }
  EXPECT_EQ(client_->stale_map_retries(), 2 * kRefusals);
}

// A push is all-or-nothing per server, not across servers: a call whose part failed for good
// after another part was applied says which parts were applied.
TEST_F(ClientFailover, APushPartlyAppliedSaysWhichPartsWereApplied) {
  Start(2);
  servers_[1]->SetPolicy([](const Received& r, Header* reply, std::vector<std::string>*) {
    if (IsPush(r.h.op)) {
      reply->status = StatusCode::kInvalidArgument;
      reply->message = "refused (test)";
    }
    return true;
  });
  const Table t = Sparse(1);
  std::vector<uint64_t> keys = KeysOf(v1_.primary, 0, 2);
  for (uint64_t k : KeysOf(v1_.primary, 1, 2)) keys.push_back(k);
  Status s = client_->Wait(client_->Push(t, keys, std::vector<float>(keys.size(), 1.0f)),
                           DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("refused (test)"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("[push partly applied: 1 part(s) failed as above; applied and "
                             "acknowledged, so not to be sent again: server 0]"),
            std::string::npos)
      << s.ToString();

  const Table d{TableIdForName("w"), TableSpec::Dense("w", 2 * kDenseChunkFloats)};
  const std::vector<float> grads(d.spec.length, 1.0f);
  s = client_->Wait(client_->DensePush(d, 0, grads), DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // The part's range too: a part goes as chunk requests (ClientOptions::dense_chunk_bytes).
  EXPECT_NE(s.message().find("applied and acknowledged, so not to be sent again: part 0 "
                             "[16384, 32768) on server 0]"),
            std::string::npos)
      << s.ToString();
  // Nothing applied anywhere: the error says only what failed.
  servers_[0]->SetPolicy([](const Received& r, Header* reply, std::vector<std::string>*) {
    if (IsPush(r.h.op)) reply->status = StatusCode::kInvalidArgument;
    return true;
  });
  s = client_->Wait(client_->Push(t, keys, std::vector<float>(keys.size(), 1.0f)),
                    DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(s.message().find("partly applied"), std::string::npos) << s.ToString();
}

TEST_F(ClientFailover, DenseRequestsOfARetiredServerFailAtOnce) {
  Start(2);
  servers_[0]->SetPolicy(Silent);
  const Table t{TableIdForName("w"), TableSpec::Dense("w", 2 * kDenseChunkFloats)};
  const DenseRange r = DenseRangeOfServer(t.id, t.spec.length, 0, 2);
  ASSERT_LT(r.begin, r.end);
  std::vector<float> out(r.end - r.begin);
  Handle in_flight = client_->DensePull(t, r.begin, r.end - r.begin, out.data());
  Handle clock = client_->Clock();  // in flight to server 0 too
  ASSERT_TRUE(servers_[0]->WaitFor(Op::kDensePull, 1));
  ASSERT_TRUE(servers_[0]->WaitFor(Op::kClock, 1));

  const auto t0 = std::chrono::steady_clock::now();
  source_->Publish(Retire0(2, {1}));
  Status s = client_->Wait(in_flight, DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("retired by cluster map version 2"), std::string::npos)
      << s.ToString();
  EXPECT_NE(s.message().find("dense tables are not replicated"), std::string::npos)
      << s.ToString();
  // The server is gone: a clock it never answered is not an error.
  EXPECT_TRUE(client_->Wait(clock, DeadlineAfterMs(5000)).ok());

  // A dense request made after the map changed fails the same way, without a send.
  s = client_->Wait(client_->DensePull(t, r.begin, r.end - r.begin, out.data()),
                    DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 4.0);
  EXPECT_EQ(servers_[0]->Of(Op::kDensePull).size(), 1u);
}

// A server that answers a dense pull with more floats than the part asked for (a bug, or not
// a Tessera server) gets the call failed: the reply is not copied past the caller's range.
TEST_F(ClientFailover, ADensePullReplyOfTheWrongLengthIsRefusedNotCopied) {
  Start(1);
  servers_[0]->SetPolicy([](const Received& req, Header* reply,
                            std::vector<std::string>* frames) {
    reply->count = req.h.count + 1024;
    frames->emplace_back(std::string(reply->count * sizeof(float), '\x7f'));
    return true;
  });
  const Table t{TableIdForName("w"), TableSpec::Dense("w", 64)};
  std::vector<float> buf(16 + 2048, -1.0f);  // 16 asked for, then guard floats
  Status s = client_->Wait(client_->DensePull(t, 0, 16, buf.data()), DeadlineAfterMs(5000));
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("malformed dense reply"), std::string::npos) << s.ToString();
  for (size_t i = 16; i < buf.size(); ++i) ASSERT_EQ(buf[i], -1.0f) << "written at " << i;
}

// A Clock that timed out is sent again with the worker's clock now, not its own old value:
// sent after the next Clock, the old value moved the server's clock back (a pull at the new
// clock then waited for nothing to release it).
TEST(ClientClock, AClockSentAgainCarriesTheCurrentClock) {
  FakeServer server(0);
  std::atomic<int> clocks{0};
  server.SetPolicy([&](const Received& req, Header*, std::vector<std::string>*) {
    return !(req.h.op == Op::kClock && clocks.fetch_add(1) == 0);  // the first: no answer
  });
  ClientOptions o;
  o.servers = {server.endpoint()};
  o.request_timeout_ms = 200;
  o.retry_for_ms = 10000;
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Handle first = (*c)->Clock();
  Handle second = (*c)->Clock();
  EXPECT_TRUE((*c)->Wait(second, DeadlineAfterMs(5000)).ok());
  EXPECT_TRUE((*c)->Wait(first, DeadlineAfterMs(5000)).ok());
  // The first is sent with 1, or already with 2 when the second Clock() came before the I/O
  // thread sent it; either way no clock the server receives is below one it received before.
  const std::vector<Received> got = server.Of(Op::kClock);
  ASSERT_GE(got.size(), 3u);
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_GE(got[i].h.clock, got[i - 1].h.clock)
        << "clock " << i << " went back: the first Clock, sent again, carried its old value";
  }
  EXPECT_EQ(got.back().h.clock, 2);
}

// A barrier carries the client's id: with the request id (the same in a resend after a lost
// connection) it lets the server answer a resend of an arrival it released already instead of
// opening a round for it alone (Consistency.AResentArrivalAtAReleasedBarrierIsAnsweredAtOnce).
TEST(ClientBarrier, ABarrierCarriesTheClientIdAndANewRequestIdPerCall) {
  FakeServer server(0);
  ClientOptions o;
  o.servers = {server.endpoint()};
  o.consistency.num_workers = 1;
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*c)->Barrier("b", DeadlineAfterMs(5000)).ok());
  ASSERT_TRUE((*c)->Barrier("b", DeadlineAfterMs(5000)).ok());
  const std::vector<Received> got = server.Of(Op::kBarrier);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0].h.client_id, 0u);
  EXPECT_EQ(got[0].h.client_id, got[1].h.client_id);
  EXPECT_NE(got[0].h.request_id, got[1].h.request_id);
}

}  // namespace
}  // namespace tessera
