// Replication and fail-over (docs/elasticity.md): three real tessera-server processes with
// --coordinator in a real etcd, a map made by `tessera-ctl map init --replication=2` (every
// slot has a backup, the next server), clients routing by the map in etcd.
//  - kill -9 of a primary while a client trains: the backup is promoted when the dead server's
//    lease expires, the client sends what the dead server had not answered to the new
//    primary, and every acknowledged push is there, key by key, applied once;
//  - a primary stopped (SIGSTOP) past its lease and resumed cannot apply a push: its backup,
//    promoted meanwhile, refuses what it forwards, and it applies nothing its backup did not
//    take.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "ps/client/client.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/membership.h"
#include "ps/coord/slot_map_store.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/replicated_cluster.h"
#include "tests/raw_peer.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/failover";

class FailoverTest : public ReplicatedClusterTest {
 protected:
  FailoverTest() : ReplicatedClusterTest(kPrefix) {}

  // A training client's pushes (SGD, lr 1, zeros initializer: a row reads minus the sum of
  // the pushes it took), four in flight at a time like a worker that pipelines: each step a
  // sparse push of the distinct keys among 400 drawn from 3,000 keys over every slot, with
  // integer gradients (exact sums), and a dense push of 3,000 floats (a part on each server;
  // `salt` varies them by test). What is acknowledged is summed into `expected` and
  // `dense_expected`; the longest time between two acknowledgements is kept.
  class Training {
   public:
    static constexpr size_t kInFlight = 4;
    Training(Client& c, const Table& t, const Table& dense, uint64_t seed, int salt)
        : dense_expected(3000, 0.0), c_(c), t_(t), dense_(dense), rng_(seed), salt_(salt) {
      for (uint64_t k = 1; k <= 3000; ++k) universe.push_back(k * 7919);
    }
    // Sends step `step`'s pushes.
    void Send(int step) {
      Step s;
      for (int i = 0; i < 400; ++i) s.keys.push_back(universe[rng_() % universe.size()]);
      std::sort(s.keys.begin(), s.keys.end());
      s.keys.erase(std::unique(s.keys.begin(), s.keys.end()), s.keys.end());
      s.grads.resize(s.keys.size() * kDim);
      for (size_t i = 0; i < s.grads.size(); ++i) {
        s.grads[i] = static_cast<float>(1 + (step + i) % 4);
      }
      s.dense_grads.resize(3000);
      for (size_t i = 0; i < s.dense_grads.size(); ++i) {
        s.dense_grads[i] = static_cast<float>(1 + (step * salt_ + i) % 3);
      }
      s.handle = c_.Push(t_, s.keys, s.grads);
      s.dense_handle = c_.DensePush(dense_, 0, s.dense_grads);
      in_flight_.push_back(std::move(s));
    }
    // With kInFlight steps on their way, waits for the oldest.
    Status Pace() { return in_flight_.size() == kInFlight ? CompleteOldest() : Status::OK(); }
    // Waits for every push in flight.
    Status Drain() {
      while (!in_flight_.empty()) TESSERA_RETURN_IF_ERROR(CompleteOldest());
      return Status::OK();
    }
    const Table& table() const { return t_; }
    const Table& dense() const { return dense_; }

    std::vector<uint64_t> universe;
    std::map<uint64_t, double> expected;
    std::vector<double> dense_expected;
    double longest_gap_ms = 0;

   private:
    struct Step {
      Handle handle, dense_handle;
      std::vector<uint64_t> keys;
      std::vector<float> grads, dense_grads;
    };
    Status CompleteOldest() {
      Step& s = in_flight_.front();
      TESSERA_RETURN_IF_ERROR(c_.Wait(s.handle));
      TESSERA_RETURN_IF_ERROR(c_.Wait(s.dense_handle).WithContext("dense"));
      for (size_t i = 0; i < s.dense_grads.size(); ++i) dense_expected[i] += s.dense_grads[i];
      longest_gap_ms = std::max(longest_gap_ms, MsSince(last_done_));
      last_done_ = std::chrono::steady_clock::now();
      // Acknowledged: it counts.
      for (size_t i = 0; i < s.keys.size(); ++i) {
        for (uint32_t d = 0; d < kDim; ++d) {
          expected[s.keys[i] * kDim + d] += s.grads[i * kDim + d];
        }
      }
      in_flight_.pop_front();
      return Status::OK();
    }

    Client& c_;
    const Table t_, dense_;
    std::mt19937_64 rng_;
    const int salt_;
    std::deque<Step> in_flight_;
    std::chrono::steady_clock::time_point last_done_ = std::chrono::steady_clock::now();
  };

  // A sparse push of `n` keys of table `t` as server 1 forwards it to a backup (replica_from
  // and client_origin server 1 + 1), of map version `map_version`, numbered `seq` of `client`.
  static Header ForwardedByServerOne(const Table& t, size_t n, uint64_t map_version,
                                     uint64_t client, uint64_t seq) {
    Header h = SparseHeader(Op::kSparsePush, t.id, n, kDim);
    h.map_version = map_version;
    h.replica_from = 2;
    h.client_id = client;
    h.client_origin = 2;
    h.client_seq = seq;
    return h;
  }

  // The sparse table "emb" and the dense table "mlp" (3,000 floats) of a Training on `c`.
  std::unique_ptr<Training> StartTraining(Client& c, uint64_t seed, int salt) {
    const Table t = Sparse(c, "emb");
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;
    auto dense = c.CreateTable(TableSpec::Dense("mlp", 3000, sgd));
    EXPECT_TRUE(dense.ok()) << dense.status().ToString();
    if (!dense.ok()) return nullptr;
    return std::make_unique<Training>(c, t, *dense, seed, salt);
  }

  // Reads every key of the training's universe and its whole dense table by a new client of
  // the current map: each must equal minus the sum of the acknowledged pushes, exactly.
  void ExpectSumsOfAcknowledgedPushes(Training& training) {
    auto reader = CoordinatorClient();
    ASSERT_NE(reader, nullptr);
    const std::vector<uint64_t>& universe = training.universe;
    std::vector<float> out(universe.size() * kDim, -999.0f);
    Status st = reader->Wait(reader->Pull(training.table(), universe, out.data()));
    ASSERT_TRUE(st.ok()) << st.ToString();
    size_t wrong = 0;
    for (size_t i = 0; i < universe.size(); ++i) {
      for (uint32_t d = 0; d < kDim; ++d) {
        const double want = -training.expected[universe[i] * kDim + d];
        if (out[i * kDim + d] != want && ++wrong <= 5) {
          ADD_FAILURE() << "key " << universe[i] << " element " << d << ": " << out[i * kDim + d]
                        << ", acknowledged pushes sum to " << want;
        }
      }
    }
    EXPECT_EQ(wrong, 0u);
    const std::vector<double>& dense_expected = training.dense_expected;
    std::vector<float> mlp(dense_expected.size(), -999.0f);
    st = reader->Wait(reader->DensePull(training.dense(), 0, mlp.size(), mlp.data()));
    ASSERT_TRUE(st.ok()) << st.ToString();
    size_t dense_wrong = 0;
    for (size_t i = 0; i < mlp.size(); ++i) {
      if (mlp[i] != -dense_expected[i] && ++dense_wrong <= 5) {
        ADD_FAILURE() << "dense element " << i << ": " << mlp[i]
                      << ", acknowledged pushes sum to " << -dense_expected[i];
      }
    }
    EXPECT_EQ(dense_wrong, 0u);
  }
};

// kill -9 of a primary during training: no acknowledged push is lost or applied twice.
TEST_F(FailoverTest, KillPrimaryDuringTrainingLosesNoAcknowledgedPush) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  // A lost or doubled push shows in the keys it touched. Four pushes are in flight at a time,
  // so the kill finds some pushes forwarded to the backup and not yet answered, and some not
  // yet taken.
  auto training = StartTraining(*c, /*seed=*/42, /*salt=*/7);
  ASSERT_NE(training, nullptr);
  constexpr int kSteps = 150, kKillAt = 40;
  for (int step = 0; step < kSteps; ++step) {
    training->Send(step);
    if (step == kKillAt) cluster_->Kill(1);  // with kInFlight pushes on their way
    Status st = training->Pace();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  Status drained = training->Drain();
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  std::printf("fail-over during training: the longest wait for a push was %.0f ms (lease TTL "
              "%d s); client at map version %llu; server 2 answered %lld pushes as retries\n",
              training->longest_gap_ms, kTtlS,
              static_cast<unsigned long long>(c->cluster_map_version()),
              static_cast<long long>(ServerStat(2, "retried_pushes")));
  // The dead server's slots have a new primary; it was not restarted.
  ASSERT_TRUE(WaitForPromotion(1, seconds(1)));
  EXPECT_FALSE(cluster_->running(1));
  // Every key, read from the new map's primaries by a new client: the sum of every
  // acknowledged push, exactly once.
  // (The dense table's part on server 1 moved to its backup, server 2.)
  ExpectSumsOfAcknowledgedPushes(*training);
  // The stall is reported, not asserted (a loaded machine only makes it longer): it is the
  // lease TTL, etcd's expiry check, the promotion's poll and the map's way to the client.
}

// After a fail-over the promoting server gives the slots and dense parts left without a backup
// a new one (the next live server), copying their rows while the client trains; a second
// kill -9, of the server that was promoted, then loses nothing either: every key and dense
// element is read back from the last server standing as the sum of the acknowledged pushes.
TEST_F(FailoverTest, BackupsAreRebuiltSoASecondKillLosesNothing) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  auto training = StartTraining(*c, /*seed=*/7, /*salt=*/5);
  ASSERT_NE(training, nullptr);
  constexpr int kKillAt = 30, kAfterSecondKill = 60, kMaxSteps = 20000;
  // Every slot and dense part has a live backup again and no copy is under way.
  auto rebuilt = [&] {
    auto m = store_->Load();
    if (!m.ok()) return false;
    for (uint32_t part = 0; part < m->dense_servers; ++part) {
      if (m->dense_primary[part] == 1 || m->dense_backup[part] == ClusterMap::kNoServer ||
          m->dense_backup[part] == 1 ||
          (!m->dense_importing.empty() && m->dense_importing[part] != ClusterMap::kNoServer)) {
        return false;
      }
    }
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      if (m->primary[slot] == 1 || m->backup[slot] == ClusterMap::kNoServer ||
          m->backup[slot] == 1 || m->importing[slot] != ClusterMap::kNoServer) {
        return false;
      }
    }
    return true;
  };
  int second_kill_at = -1;
  const auto first_kill = std::chrono::steady_clock::now();
  double rebuilt_after_s = 0;
  int step = 0;
  for (; step < kMaxSteps && (second_kill_at < 0 || step < second_kill_at + kAfterSecondKill);
       ++step) {
    training->Send(step);
    if (step == kKillAt) cluster_->Kill(1);
    if (step > kKillAt && second_kill_at < 0 && step % 10 == 0 && rebuilt()) {
      rebuilt_after_s = MsSince(first_kill) / 1000;
      cluster_->Kill(2);  // the promoted primary of server 1's slots, with pushes in flight
      second_kill_at = step;
    }
    Status st = training->Pace();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  Status drained = training->Drain();
  ASSERT_TRUE(drained.ok()) << drained.ToString();
  ASSERT_GE(second_kill_at, 0) << "the backups were not rebuilt within " << kMaxSteps
                               << " steps of the first kill";
  std::printf("backup rebuild: every slot backed up again %.1f s after the first kill -9 "
              "(lease TTL %d s); server 0 imported %lld rows and held %lld forwarded pushes "
              "for fills; %d steps after the second kill\n",
              rebuilt_after_s, kTtlS, static_cast<long long>(ServerStat(0, "slot_rows_imported")),
              static_cast<long long>(ServerStat(0, "fill_held_total")), step - second_kill_at);
  // Everything is on server 0 now.
  ASSERT_TRUE(WaitForPromotion(2, seconds(30)));
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::count(m->primary.begin(), m->primary.end(), 0), kNumSlots);
  // One server left: no backup can be rebuilt, and `map rebuild` says why, changing nothing.
  std::string ctl;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "rebuild", "--coordinator=" + url_}, &ctl), 1)
      << ctl;
  EXPECT_NE(ctl.find("at least 2 registered servers"), std::string::npos) << ctl;
  auto after = store_->Load();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->version, m->version);
  ExpectSumsOfAcknowledgedPushes(*training);
}

// The exactly-once step of a fail-over, without timing luck: a push the primary forwarded to
// its backup and then died before answering is sent again by the client to the promoted
// backup, under the dead primary's number (client_origin): answered as a retry, applied once.
// Under a new number it would be applied twice.
TEST_F(FailoverTest, PushTheBackupHoldsIsNotAppliedAgainAfterTheFailover) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 100);
  const std::vector<float> g(keys.size() * kDim, 2.0f);
  RawPeer to_primary(cluster_->endpoints()[1]);
  Header h = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
  h.map_version = 1;
  h.client_id = 777;
  h.client_seq = 1;
  ASSERT_EQ(to_primary.Call(h, {Bytes(keys), Bytes(g)}).status, StatusCode::kOk);
  EXPECT_EQ(ServerStat(1, "replicated_pushes"), 1);
  // The answer "was lost": server 1 dies, server 2 takes its slots.
  cluster_->Kill(1);
  ASSERT_TRUE(WaitForPromotion(1, seconds(kTtlS + 30)));
  ASSERT_TRUE(WaitFor([&] { return ServerStat(2, "map_version") >= 2; }, seconds(30)));
  const int64_t map_version = ServerStat(2, "map_version");
  RawPeer to_new(cluster_->endpoints()[2]);
  Header again = h;
  again.map_version = static_cast<uint64_t>(map_version);
  again.client_origin = 2;  // server 1 + 1: the sequence the number counts in
  Header r = to_new.Call(again, {Bytes(keys), Bytes(g)});
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  EXPECT_EQ(ServerStat(2, "retried_pushes"), 1);
  // A push of the same client counted in server 2's own sequence is another push.
  Header own = h;
  own.map_version = static_cast<uint64_t>(map_version);
  r = to_new.Call(own, {Bytes(keys), Bytes(g)});
  ASSERT_EQ(r.status, StatusCode::kOk) << r.message;
  ASSERT_TRUE(WaitFor([&] { return c->cluster_map_version() >= 2; }, seconds(30)));
  std::vector<float> out(keys.size() * kDim, -999.0f);
  Status s = c->Wait(c->Pull(t, keys, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], -4.0f) << "key " << keys[i / kDim] << ": the forwarded push and the "
                                "other one, once each";
  }
}

// A backup whose map is older than the primary's holds a forwarded push, in order, until its
// map is there, instead of refusing it at once: a refused push resent after a later one of
// the same client was taken would be taken for a retry and lost. It holds it only until it
// has read the map from etcd again: a version etcd does not hold yet is refused (no primary
// forwards under a map that is not stored; ForwardedPushTest has a forged one).
TEST_F(FailoverTest, ABackupBehindThePrimarysMapHoldsForwardedPushesInOrder) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 50);  // server 1's slots, backed up by 2
  // Two pushes as server 1 forwards them, of map version 2 while etcd and every server are
  // at 1: refused, in order, once server 2 read etcd again.
  RawPeer as_primary(cluster_->endpoints()[2]);
  Header h = ForwardedByServerOne(t, keys.size(), /*map_version=*/2, /*client=*/555, /*seq=*/1);
  const std::vector<std::string> one = {Bytes(keys),
                                        Bytes(std::vector<float>(keys.size() * kDim, 1.0f))};
  const std::vector<std::string> two = {Bytes(keys),
                                        Bytes(std::vector<float>(keys.size() * kDim, 2.0f))};
  Header h2 = h;
  h2.client_seq = 2;
  auto send_both = [&] {
    ASSERT_TRUE(as_primary.Resend(h, /*request_id=*/1, one));
    ASSERT_TRUE(as_primary.Resend(h2, /*request_id=*/2, two));
  };
  auto answers = [&] {
    std::vector<Header> got;
    as_primary.socket().set(zmq::sockopt::rcvtimeo, 30000);
    for (int i = 0; i < 2; ++i) {
      std::vector<zmq::message_t> reply;
      if (!zmq::recv_multipart(as_primary.socket(), std::back_inserter(reply)).has_value()) break;
      Header r;
      EXPECT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
      got.push_back(r);
    }
    return got;
  };
  send_both();
  std::vector<Header> got = answers();
  ASSERT_EQ(got.size(), 2u) << "a forwarded push of a map etcd does not hold was not answered";
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].request_id, i + 1);
    EXPECT_EQ(got[i].status, StatusCode::kFailedPrecondition) << got[i].message;
  }
  EXPECT_EQ(ServerStat(2, "push_keys"), 0);
  // Version 2 (same owners and backups) in etcd, then both again as server 1 sends them:
  // held until server 2 has the map (its watch, or its own read), applied in order, answered.
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ClusterMap next = *m;
  next.version = 2;
  ASSERT_TRUE(store_->CompareAndSwap(1, next).ok());
  send_both();
  got = answers();
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].request_id, i + 1);
    EXPECT_EQ(got[i].status, StatusCode::kOk) << got[i].message;
  }
  EXPECT_EQ(ServerStat(2, "retried_pushes"), 0);  // the second was not taken for a retry
  EXPECT_GE(ServerStat(2, "push_keys"), 100);
}

// A backup being filled (a rebuild: the map names it the backup of server 1's slots and dense
// part 1, importing from server 1) holds the pushes server 1 forwards for them until the copy
// is marked in, slots and dense part each on their own, and then applies them in order. The
// primary's resends of a held push (every 500 ms while unanswered) are dropped, not held again.
TEST_F(FailoverTest, ABackupBeingFilledHoldsForwardedPushesUntilTheCopyIsIn) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  constexpr uint64_t kLength = 3 * kDenseChunkFloats;  // a chunk in each dense part
  auto dense = c->CreateTable(TableSpec::Dense("mlp", kLength, sgd));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ClusterMap next = *m;
  std::vector<uint32_t> slots;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (next.primary[slot] != 1) continue;
    next.backup[slot] = 0;
    next.importing[slot] = 1;
    slots.push_back(slot);
  }
  next.dense_backup[1] = 0;
  next.dense_importing.assign(3, ClusterMap::kNoServer);
  next.dense_importing[1] = 1;
  next.version = 2;
  ASSERT_TRUE(store_->CompareAndSwap(1, next).ok());
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "map_version") == 2; }, seconds(30)));

  // As server 1 forwards them: a sparse push of its slots, then a dense push of part 1.
  const std::vector<uint64_t> keys = KeysOf(1, 50);
  RawPeer as_primary(cluster_->endpoints()[0]);
  Header h = ForwardedByServerOne(t, keys.size(), /*map_version=*/2, /*client=*/777, /*seq=*/1);
  ASSERT_TRUE(as_primary.Send(h, {Bytes(keys), Bytes(std::vector<float>(keys.size() * kDim, 1.0f))}));
  const DenseRange part1 = DenseRangeOfServer(dense->id, kLength, 1, 3);
  ASSERT_LT(part1.begin, part1.end);
  Header d;
  d.op = Op::kDensePush;
  d.table_id = dense->id;
  d.elem_type = ElemType::kF32;
  d.offset = part1.begin;
  d.count = 8;
  d.map_version = 2;
  d.replica_from = 2;
  d.client_id = 777;
  d.client_origin = 2;
  d.client_seq = 2;
  ASSERT_TRUE(as_primary.Send(d, {Bytes(std::vector<float>(8, 3.0f))}));
  auto answer = [&](int timeout_ms) -> std::optional<Header> {
    as_primary.socket().set(zmq::sockopt::rcvtimeo, timeout_ms);
    std::vector<zmq::message_t> reply;
    if (!zmq::recv_multipart(as_primary.socket(), std::back_inserter(reply)).has_value()) {
      return std::nullopt;
    }
    Header r;
    EXPECT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
    return r;
  };
  EXPECT_FALSE(answer(500).has_value()) << "a push for a slot being filled was answered";
  const std::vector<std::string> frames = {Bytes(keys),
                                           Bytes(std::vector<float>(keys.size() * kDim, 1.0f))};
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(as_primary.Resend(h, /*request_id=*/1, frames));
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "replica_resends_dropped") == 5; }, seconds(30)))
      << "replica_resends_dropped " << ServerStat(0, "replica_resends_dropped");
  EXPECT_EQ(ServerStat(0, "replica_parked_now"), 2);
  // The slots' copy is in (no rows: the backup starts from nothing): the sparse push is applied
  // and answered; the dense one still waits for its part.
  ASSERT_TRUE(admin_->ImportSlots(0, 2, slots, Client::SlotImportStep::kDone).ok());
  auto first = answer(30000);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->status, StatusCode::kOk) << first->message;
  EXPECT_EQ(first->request_id, 1u);  // RawPeer numbers its requests 1, 2, ...
  EXPECT_FALSE(answer(500).has_value()) << "a push for a dense part being filled was answered";
  ASSERT_TRUE(admin_->ImportSlots(0, 2, std::vector<uint32_t>{1},
                                  Client::SlotImportStep::kDenseDone)
                  .ok());
  auto second = answer(30000);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->status, StatusCode::kOk) << second->message;
  EXPECT_EQ(second->request_id, 2u);
  EXPECT_EQ(ServerStat(0, "retried_pushes"), 0);
  EXPECT_GE(ServerStat(0, "fill_held_total"), 2);
  // Marked in: copied rows for those slots are refused from now on.
  Status again = admin_->ImportSlots(0, 2, slots, Client::SlotImportStep::kRows, std::string());
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
}

// A primary stopped past its lease, then resumed: the push it takes at its old map version
// is not applied anywhere, and it is not acknowledged.
TEST_F(FailoverTest, StoppedOldPrimaryCannotApplyAfterTakeover) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 200);
  std::vector<float> g(keys.size() * kDim, 1.0f);
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  // Server 1 logs a push only once its backup took it (the log holds what it applies).
  const int64_t logged = ServerStat(1, "log_last_seq");
  ASSERT_GT(logged, 0);

  // A raw peer of server 1, connected while it runs (a client that has not seen the
  // fail-over yet: it pushes at map version 1).
  RawPeer peer(cluster_->endpoints()[1], /*reply_timeout_ms=*/30000);
  Header ping;
  ping.op = Op::kPing;
  ASSERT_EQ(peer.Call(ping).status, StatusCode::kOk);

  ASSERT_EQ(kill(cluster_->pid(1), SIGSTOP), 0);
  ASSERT_TRUE(WaitForPromotion(1, seconds(kTtlS + 30))) << "server 1 was not replaced";
  ASSERT_EQ(ServerStat(2, "fenced_replicas"), 0);
  // The push waits in the stopped server's socket and is read as soon as it runs again,
  // racing the map change its watch brings.
  Header h = SparseHeader(Op::kSparsePush, t.id, keys.size(), kDim);
  h.map_version = 1;
  h.client_id = 4242;
  h.client_seq = 1;
  std::vector<float> big(keys.size() * kDim, 100.0f);
  ASSERT_TRUE(peer.Send(h, {Bytes(keys), Bytes(big)}));
  ASSERT_EQ(kill(cluster_->pid(1), SIGCONT), 0);
  std::vector<zmq::message_t> reply;
  ASSERT_TRUE(zmq::recv_multipart(peer.socket(), std::back_inserter(reply)).has_value())
      << "no answer from the resumed server";
  Header r;
  ASSERT_TRUE(DecodeHeader(reply[0].data(), reply[0].size(), &r).ok());
  EXPECT_NE(r.status, StatusCode::kOk) << "the old primary acknowledged a push after the fail-over";
  std::printf("the resumed old primary answered %s: %s (its backup refused %lld forwarded "
              "pushes)\n",
              std::string(StatusCodeName(r.status)).c_str(), r.message.c_str(),
              static_cast<long long>(ServerStat(2, "fenced_replicas")));
  // What the old primary forwards now (its push of map version 1, as it sends it to its
  // backup) is refused by the promoted backup: the fence that holds even when the old
  // primary has not seen the new map yet.
  RawPeer as_old_primary(cluster_->endpoints()[2]);
  Header fwd = h;
  fwd.replica_from = 2;  // server 1 + 1
  fwd.client_origin = 2;
  Header fr = as_old_primary.Call(fwd, {Bytes(keys), Bytes(big)});
  EXPECT_EQ(fr.status, StatusCode::kFailedPrecondition) << fr.message;
  EXPECT_NE(fr.message.find("replication refused"), std::string::npos) << fr.message;
  EXPECT_GE(ServerStat(2, "fenced_replicas"), 1);
  // The new primary has the first push only.
  ASSERT_TRUE(WaitFor([&] { return c->cluster_map_version() >= 2; }, seconds(30)));
  std::vector<float> out(keys.size() * kDim, -999.0f);
  Status s = c->Wait(c->Pull(t, keys, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], -1.0f) << "key " << keys[i / kDim];
  }
  // And the old primary applied nothing either: it logs (and then applies) a push only after
  // its backup took it, and its log did not move.
  EXPECT_EQ(ServerStat(1, "log_last_seq"), logged);
}

// Resharding a replicated map: while a slot moves (server 1 -> 0, its backup 2 kept), its
// backup takes the pushes the old primary forwarded before the flip, and a backup dropped from
// a slot (resharding gives it another) takes those sent before the drop: refusing either would
// fail a push the old primary may already have answered later ones of. A server that is the
// slot's primary never takes another's forwarded push, and once the move settled the old
// primary is refused.
TEST_F(FailoverTest, ABackupTakesTheOldPrimarysPushesWhileTheSlotMovesOrAfterItWasDropped) {
  // The test writes the maps by hand: the controller lock keeps the lowest server's background
  // rebuild (due once slots lose their backup below) from changing the map meanwhile.
  auto lock = LockController(client_.get(), "/" + std::string(kPrefix), "this-test", 30,
                             /*wait=*/false, std::chrono::steady_clock::now());
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  std::vector<uint64_t> moving, dropped;  // server 1's keys by slot parity
  for (uint64_t k : KeysOf(1, 400)) (SlotOfKey(k) % 2 == 0 ? moving : dropped).push_back(k);
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ClusterMap next = *m;
  next.version = 2;
  for (uint64_t k : moving) {
    next.primary[SlotOfKey(k)] = 0;
    next.importing[SlotOfKey(k)] = 1;
  }
  for (uint64_t k : dropped) next.backup[SlotOfKey(k)] = ClusterMap::kNoServer;
  ASSERT_TRUE(store_->CompareAndSwap(1, next).ok());
  ASSERT_TRUE(WaitFor([&] { return ServerStat(0, "map_version") == 2 &&
                                   ServerStat(2, "map_version") == 2; }, seconds(30)));
  // Pushes as server 1 forwarded them at map version 1.
  auto forwarded = [&](uint32_t to, const std::vector<uint64_t>& keys, uint64_t seq) {
    RawPeer as_old_primary(cluster_->endpoints()[to]);
    const Header h = ForwardedByServerOne(t, keys.size(), /*map_version=*/1, /*client=*/777, seq);
    return as_old_primary.Call(h, {Bytes(keys), Bytes(std::vector<float>(keys.size() * kDim, 1))});
  };
  const int64_t before = ServerStat(2, "push_keys");
  Header r = forwarded(2, moving, 1);
  EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
  r = forwarded(2, dropped, 2);
  EXPECT_EQ(r.status, StatusCode::kOk) << r.message;
  const auto both = static_cast<int64_t>(moving.size() + dropped.size());
  EXPECT_EQ(ServerStat(2, "push_keys"), before + both);
  EXPECT_EQ(ServerStat(2, "fenced_replicas"), 0);
  // A backup's rows are the slots' other copy: never dropped while the map names it.
  ClientOptions one;
  one.servers = {cluster_->endpoints()[2]};
  auto to_backup = Client::Create(one);
  ASSERT_TRUE(to_backup.ok()) << to_backup.status().ToString();
  const std::vector<uint32_t> backed = {SlotOfKey(moving[0])};
  Status drop = (*to_backup)->DropSlots(0, 2, backed);
  EXPECT_EQ(drop.code(), StatusCode::kFailedPrecondition) << drop.ToString();
  EXPECT_NE(drop.message().find("is backed up by server 2"), std::string::npos) << drop.ToString();
  // Server 0, the moving slots' new primary, refuses one: its rows come with the copy.
  r = forwarded(0, moving, 3);
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("replication refused"), std::string::npos) << r.message;
  // Settled (importing cleared): the old primary's pushes for them are refused.
  next.version = 3;
  next.importing.assign(kNumSlots, ClusterMap::kNoServer);
  ASSERT_TRUE(store_->CompareAndSwap(2, next).ok());
  ASSERT_TRUE(WaitFor([&] { return ServerStat(2, "map_version") == 3; }, seconds(30)));
  r = forwarded(2, moving, 4);
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_EQ(ServerStat(2, "fenced_replicas"), 1);
}

// A rebuild left undone (here: server 1's slots stripped of their backups by hand, as if the
// server that promoted them died before giving them new ones) is run by the lowest live server
// on its own; the backups it fills are exact: after kill -9 of server 1 its promoted slots read
// every acknowledged push.
TEST_F(FailoverTest, ARebuildLeftUndoneIsFinishedByTheLowestLiveServer) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = KeysOf(1, 500);
  std::vector<float> g(keys.size() * kDim, 3.0f);
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  auto m = store_->Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ClusterMap stripped = *m;
  stripped.version = 2;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    if (stripped.primary[slot] == 1) stripped.backup[slot] = ClusterMap::kNoServer;
  }
  ASSERT_TRUE(store_->CompareAndSwap(1, stripped).ok());
  // Pushes go on meanwhile (server 1 applies them without a backup until one is filled).
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto now = store_->Load();
        if (!now.ok() || now->version <= 2) return false;
        for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
          if (now->backup[slot] == ClusterMap::kNoServer ||
              now->importing[slot] != ClusterMap::kNoServer) {
            return false;
          }
        }
        return true;
      },
      seconds(60)))
      << "the backups were not rebuilt";
  std::printf("backups rebuilt %.1f s after they were stripped\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  cluster_->Kill(1);
  ASSERT_TRUE(WaitForPromotion(1, seconds(kTtlS + 30))) << "server 1 was not replaced";
  std::vector<float> out(keys.size() * kDim, -999.0f);
  Status s = c->Wait(c->Pull(t, keys, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], -9.0f) << "key " << keys[i / kDim];
  }
}

}  // namespace
}  // namespace tessera::testing
