// Online resharding (docs/elasticity.md): `tessera-ctl scale` moves slots between real
// tessera-server processes that follow the cluster map in a real etcd, while a BSP training
// loop goes on. The loop's parameters must end bit-identical to the same loop on a fixed
// 2-server cluster: no push lost, none applied twice, optimizer state and step counts moved
// with the rows.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

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

constexpr char kPrefix[] = "tessera/reshard";
constexpr uint32_t kDim = 8;
constexpr uint64_t kDenseLength = 6000;
constexpr uint64_t kKeySpace = 60000;
constexpr size_t kKeysPerStep = 400;

// A 1-worker bulk-synchronous training loop: each step pulls its keys and the dense tensor,
// computes gradients from what it read (so a lost, doubled or stale update changes every later
// step), pushes them, waits, and advances the clock.
class Trainer {
 public:
  explicit Trainer(Client& c) : c_(c) {
    OptimizerSpec adam;
    adam.kind = OptimizerKind::kAdam;  // sparse: the row's own step count (metadata) matters
    adam.learning_rate = 0.01f;
    OptimizerSpec adagrad;
    adagrad.kind = OptimizerKind::kAdagrad;
    adagrad.learning_rate = 0.05f;
    auto e = c.CreateTable(TableSpec::Sparse("emb", kDim, adam));
    auto d = c.CreateTable(TableSpec::Dense("mlp", kDenseLength, adagrad));
    EXPECT_TRUE(e.ok() && d.ok()) << e.status().ToString() << d.status().ToString();
    if (e.ok()) emb_ = *e;
    if (d.ok()) dense_ = *d;
  }

  Status Step(uint64_t step) {
    std::mt19937_64 rng(step);
    std::set<uint64_t> unique;
    while (unique.size() < kKeysPerStep) {
      // Skewed: small keys come up often, so rows are updated across many steps.
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      unique.insert(1 + static_cast<uint64_t>(std::pow(u, 3.0) * kKeySpace));
    }
    std::vector<uint64_t> keys(unique.begin(), unique.end());
    for (uint64_t k : keys) touched_.insert(k);
    std::vector<float> rows(keys.size() * kDim), w(kDenseLength);
    TESSERA_RETURN_IF_ERROR(c_.Wait(c_.Pull(emb_, keys, rows.data())));
    TESSERA_RETURN_IF_ERROR(c_.Wait(c_.DensePull(dense_, 0, kDenseLength, w.data())));
    std::vector<float> g(rows.size()), dg(kDenseLength);
    for (size_t i = 0; i < rows.size(); ++i) {
      g[i] = 0.3f * rows[i] + 0.01f * static_cast<float>((keys[i / kDim] + step + i % kDim) % 7) -
             0.03f + 0.001f * w[i % kDenseLength];
    }
    for (size_t i = 0; i < kDenseLength; ++i) {
      dg[i] = 0.2f * w[i] - 0.01f * rows[i % rows.size()];
    }
    Handle p = c_.Push(emb_, keys, g);
    Handle dp = c_.DensePush(dense_, 0, dg);
    TESSERA_RETURN_IF_ERROR(c_.Wait(p));
    TESSERA_RETURN_IF_ERROR(c_.Wait(dp));
    return c_.Wait(c_.Clock());
  }

  // Every row any step touched, and the dense tensor.
  Status Final(std::vector<uint64_t>* keys, std::vector<float>* rows, std::vector<float>* w) {
    keys->assign(touched_.begin(), touched_.end());
    rows->assign(keys->size() * kDim, 0.0f);
    w->assign(kDenseLength, 0.0f);
    TESSERA_RETURN_IF_ERROR(c_.Wait(c_.Pull(emb_, *keys, rows->data())));
    return c_.Wait(c_.DensePull(dense_, 0, kDenseLength, w->data()));
  }

 private:
  Client& c_;
  Table emb_, dense_;
  std::set<uint64_t> touched_;
};

ClientOptions TrainingOptions() {
  ClientOptions o;
  o.consistency.num_workers = 1;
  o.consistency.staleness = 0;
  o.worker_id = 0;
  o.request_timeout_ms = 10000;
  o.retry_for_ms = 60000;
  return o;
}

// What a training run gives: every row it touched (keys and floats) and the dense tensor.
struct Params {
  std::vector<uint64_t> keys;
  std::vector<float> rows, w;
};

// The same floats, bit for bit, naming the first that differ.
void ExpectBitIdentical(const Params& got, const Params& want, const std::string& what) {
  ASSERT_EQ(got.keys, want.keys) << what;
  size_t differing = 0;
  for (size_t i = 0; i < got.rows.size(); ++i) {
    if (std::memcmp(&got.rows[i], &want.rows[i], sizeof(float)) != 0 && differing++ < 5) {
      ADD_FAILURE() << what << ": key " << got.keys[i / kDim] << " element " << i % kDim << ": "
                    << got.rows[i] << " elastic, " << want.rows[i] << " fixed";
    }
  }
  EXPECT_EQ(differing, 0u) << what << ": of " << got.rows.size() << " sparse floats";
  EXPECT_EQ(0, std::memcmp(got.w.data(), want.w.data(), got.w.size() * sizeof(float)))
      << what << ": the dense tensor differs";
}

class ReshardTest : public EtcdTest {
 protected:
  void SetUp() override { StartCluster("", {}); }

  // Three servers register (with `server_flags`); the map starts with two of them, `map_flag`
  // added to map init.
  void StartCluster(const std::string& map_flag, const std::vector<std::string>& server_flags) {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    url_ = etcd_.url(kPrefix);
    LocalClusterOptions o = Servers(3);
    o.with_data_dirs = true;  // RocksDB engines: the moved rows go through the durable tier
    o.extra_flags = {"--coordinator=" + url_};
    o.extra_flags.insert(o.extra_flags.end(), server_flags.begin(), server_flags.end());
    cluster_ = std::make_unique<LocalCluster>(o);
    Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    admin_ = AdminClient(cluster_->endpoints());
    ASSERT_NE(admin_, nullptr);
    std::string out;
    std::vector<std::string> init = {TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url_,
                                     "--servers=" + cluster_->endpoints()[0] + "," +
                                         cluster_->endpoints()[1]};
    if (!map_flag.empty()) init.push_back(map_flag);
    ASSERT_EQ(RunCommand(init, &out), 0) << out;
    ASSERT_TRUE(WaitFor([&] { return Stat(0, "map_version") >= 1 && Stat(1, "map_version") >= 1; },
                        seconds(30)));
  }

  int64_t Stat(uint32_t r, const std::string& key) {
    auto st = admin_->ServerStats(r);
    return st.ok() ? StatOf(*st, key) : -1;
  }

  // tessera-ctl scale N: its exit code, its output in *out.
  int Scale(uint32_t n, std::string* out) {
    return RunCommand({TESSERA_CTL_BINARY, "scale", std::to_string(n), "--coordinator=" + url_,
                       "--batch_slots=2048", "--timeout_s=120"},
                      out, 180);
  }

  // A client of the map with the options of the training loop.
  std::unique_ptr<Client> TrainingClient() {
    auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    if (!source.ok()) return nullptr;
    auto client = Client::Create(TrainingOptions(), std::move(*source));
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  ClusterMap LoadMap() {
    SlotMapStore store(client_.get(), "/" + std::string(kPrefix));
    auto m = store.Load();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? *m : ClusterMap();
  }

  // `trainer`'s rows and dense tensor equal, bit for bit, `steps` steps of the loop on a fixed
  // cluster of two, whose result is returned.
  Params ExpectSameAsFixedCluster(Trainer& trainer, uint64_t steps, const std::string& what) {
    Params fixed = FixedClusterRun(steps);
    Params got;
    Status s = trainer.Final(&got.keys, &got.rows, &got.w);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (s.ok()) ExpectBitIdentical(got, fixed, what);
    return fixed;
  }

  // Whether the stored map has retired server `id`.
  bool Retired(uint32_t id) {
    const ClusterMap m = LoadMap();
    return m.servers.size() > id && m.servers[id].address.empty();
  }

  // kill -9 of server 0, then `trainer`'s rows and dense tensor, read from the promoted copies
  // on server `backup`, must still equal `fixed` bit for bit.
  void ExpectExactAfterKillingServerZero(Trainer& trainer, const Params& fixed, uint32_t backup) {
    cluster_->Kill(0);
    ASSERT_TRUE(WaitFor([&] { return Retired(0); }, seconds(30))) << "server 0 was not failed over";
    Params promoted;
    ASSERT_TRUE(trainer.Final(&promoted.keys, &promoted.rows, &promoted.w).ok());
    ExpectBitIdentical(promoted, fixed,
                       "read from server " + std::to_string(backup) + " after server 0 was killed");
  }

  // Trains while server 1 is killed (-9) at step 10 and, once the map retired it, restarted
  // under its id when `restart`, and `scale 2` runs beside the loop; returns the steps taken
  // (at least 40), the scale's output in *out.
  uint64_t TrainThroughTheLossOfServerOne(Trainer& trainer, bool restart, std::string* out) {
    std::atomic<bool> scaled{false};
    int rc = -1;
    std::thread scaler;
    uint64_t step = 0;
    for (; step < 40 || !scaled.load(); ++step) {
      Status s = step < 5000 ? trainer.Step(step) : Status::DeadlineExceeded("5000 steps");
      if (step == 10) cluster_->Kill(1);
      if (s.ok() && step > 10 && !scaler.joinable() && Retired(1)) {
        if (restart) s = cluster_->Restart(1);
        if (s.ok()) {
          scaler = std::thread([&] {
            rc = Scale(2, out);
            scaled = true;
          });
        }
      }
      if (!s.ok()) {
        ADD_FAILURE() << "step " << step << ": " << s.ToString() << "; " << *out;
        break;
      }
    }
    if (scaler.joinable()) scaler.join();
    EXPECT_EQ(rc, 0) << *out;
    return step;
  }

  // The run: trains while the server tier goes 2 -> 3 -> 2 (tessera-ctl scale beside
  // the loop); returns the steps taken, the map right after `scale 3` in *up.
  uint64_t TrainThroughTwoToThreeToTwo(Trainer& trainer, Client& client, ClusterMap* up) {
    std::atomic<int> phase{0};  // 0 before, 1 scaling up, 2 scaled up, 3 scaling down, 4 done
    std::string up_out, down_out;
    int up_rc = -1, down_rc = -1;
    int64_t server2_push_keys = 0;
    std::thread scaler;
    uint64_t step = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (; step < 40 || phase.load() != 4; ++step) {
      EXPECT_LT(step, 5000u) << "the scaling did not finish: " << up_out << down_out;
      Status s = step < 5000 ? trainer.Step(step)
                             : Status::DeadlineExceeded("the scaling did not finish in 5000 steps");
      if (!s.ok()) {
        ADD_FAILURE() << "step " << step << ": " << s.ToString();
        if (scaler.joinable()) scaler.join();
        return 0;
      }
      if (step == 15) {
        phase = 1;
        scaler = std::thread([&] {
          up_rc = Scale(3, &up_out);
          phase = 2;
        });
      }
      if (phase.load() == 2) {
        // A few steps on three servers, then back to two.
        scaler.join();
        EXPECT_EQ(up_rc, 0) << up_out;
        *up = LoadMap();
        for (int i = 0; i < 5; ++i) {
          ++step;
          s = trainer.Step(step);
          EXPECT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
        }
        server2_push_keys = Stat(2, "push_keys");
        phase = 3;
        scaler = std::thread([&] {
          down_rc = Scale(2, &down_out);
          phase = 4;
        });
      }
    }
    if (scaler.joinable()) scaler.join();
    EXPECT_EQ(down_rc, 0) << down_out;
    std::printf("elastic run: %llu steps in %.1f s\n  scale 3: %s  scale 2: %s",
                static_cast<unsigned long long>(step), MsSince(t0) / 1000, up_out.c_str(),
                down_out.c_str());
    // Server 2 served its slots while it had them, and holds nothing now; the map retired it.
    EXPECT_GT(server2_push_keys, 0) << "server 2 took no push while it owned slots";
    EXPECT_GT(Stat(2, "slot_rows_imported"), 0);
    EXPECT_GT(Stat(2, "slot_rows_exported"), 0);
    EXPECT_GT(Stat(0, "slot_rows_exported"), 0);
    std::printf("  requests held for a copy: %lld, %lld, %lld; client reroutes: %llu\n",
                static_cast<long long>(Stat(0, "import_parked_total")),
                static_cast<long long>(Stat(1, "import_parked_total")),
                static_cast<long long>(Stat(2, "import_parked_total")),
                static_cast<unsigned long long>(client.stale_map_retries()));
    for (uint32_t r = 0; r < 3; ++r) {
      std::printf("  server %u: retried_pushes %lld stale_map_refusals %lld failed_replications "
                  "%lld fenced_replicas %lld fill_held_total %lld\n",
                  r, static_cast<long long>(Stat(r, "retried_pushes")),
                  static_cast<long long>(Stat(r, "stale_map_refusals")),
                  static_cast<long long>(Stat(r, "failed_replications")),
                  static_cast<long long>(Stat(r, "fenced_replicas")),
                  static_cast<long long>(Stat(r, "fill_held_total")));
    }
    std::string show;
    EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &show), 0);
    EXPECT_NE(show.find("server 2 server-2 (retired) primary_slots 0"), std::string::npos)
        << show;
    return step;
  }

  // `steps` steps of the same loop on a fixed cluster of two.
  Params FixedClusterRun(uint64_t steps) {
    LocalClusterOptions fo = Servers(2);
    fo.with_data_dirs = true;
    LocalCluster fixed(fo);
    Params p;
    Status s = fixed.Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
    ClientOptions ro = TrainingOptions();
    ro.servers = fixed.endpoints();
    auto ref = Client::Create(ro);
    if (!s.ok() || !ref.ok()) return p;
    Trainer reference(**ref);
    for (uint64_t i = 0; i < steps; ++i) EXPECT_TRUE(reference.Step(i).ok());
    EXPECT_TRUE(reference.Final(&p.keys, &p.rows, &p.w).ok());
    return p;
  }

  std::string url_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> admin_;
};

// The run: the server tier goes 2 -> 3 -> 2 while the loop trains; the result is
// bit-identical to the same number of steps on a fixed 2-server cluster.
TEST_F(ReshardTest, TwoToThreeToTwoWhileTrainingIsBitIdenticalToAFixedCluster) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  ClusterMap up;
  const uint64_t steps = TrainThroughTwoToThreeToTwo(trainer, *client, &up);
  ASSERT_FALSE(HasFailure());
  ExpectSameAsFixedCluster(trainer, steps, "after 2 -> 3 -> 2");
}

class ReplicatedReshardTest : public ReshardTest {
 protected:
  // A short lease: the fail-over at the end comes 2 s after the kill.
  void SetUp() override { StartCluster("--replication=2", {"--coordinator_ttl_s=2"}); }
};

// Every slot backed up by a server of `servers` other than its primary, each of them backing up
// its share (within 1%).
void ExpectBackedUpEvenly(const ClusterMap& m, const std::vector<uint16_t>& servers,
                          const std::string& what) {
  std::map<uint16_t, uint32_t> count;
  for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
    ASSERT_NE(m.backup[slot], ClusterMap::kNoServer) << what << ": slot " << slot;
    ASSERT_NE(m.backup[slot], m.primary[slot]) << what << ": slot " << slot;
    ASSERT_EQ(m.importing[slot], ClusterMap::kNoServer) << what << ": slot " << slot;
    ++count[m.backup[slot]];
  }
  for (uint16_t id : servers) {
    EXPECT_NEAR(count[id], kNumSlots / servers.size(), kNumSlots / 100)
        << what << ": server " << id << " backs up " << count[id] << " slots";
  }
  EXPECT_EQ(count.size(), servers.size()) << what;
}

// The same run with --replication=2: each batch of a move keeps or regains one backup per
// slot, the loop ends bit-identical to a fixed cluster, and the backups left are exact: after
// kill -9 of server 0 its backups (all on server 1), promoted, read the same floats.
TEST_F(ReplicatedReshardTest, TwoToThreeToTwoKeepsEverySlotBackedUpAndExact) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  ClusterMap up;
  const uint64_t steps = TrainThroughTwoToThreeToTwo(trainer, *client, &up);
  ASSERT_FALSE(HasFailure());
  ExpectBackedUpEvenly(up, {0, 1, 2}, "after scale 3");
  ExpectBackedUpEvenly(LoadMap(), {0, 1}, "after scale 2");
  const Params fixed = ExpectSameAsFixedCluster(trainer, steps, "after 2 -> 3 -> 2");

  ExpectExactAfterKillingServerZero(trainer, fixed, 1);
}

// A dead server replaced while the loop trains: kill -9 of server 1 leaves server 0 alone with
// every slot and dense part and nothing to back them up; `scale 2` then brings in server 2
// (registered, not in the map: the replacement, under the next id): half the slots move to it,
// and every slot and dense part has a backup again. The loop ends bit-identical to a fixed
// cluster, and after kill -9 of server 0 the promoted copies on server 2 read the same.
TEST_F(ReplicatedReshardTest, ADeadServerIsReplacedWhileTrainingAndEverythingIsBackedUpAgain) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  std::string out;
  const uint64_t step = TrainThroughTheLossOfServerOne(trainer, /*restart=*/false, &out);
  ASSERT_FALSE(HasFailure());
  std::printf("replaced server 1 by server 2 in %llu steps: %s",
              static_cast<unsigned long long>(step), out.c_str());
  const ClusterMap m = LoadMap();
  ExpectBackedUpEvenly(m, {0, 2}, "after scale 2");
  ASSERT_EQ(m.dense_backup.size(), 2u);
  ASSERT_EQ(m.dense_primary.size(), 2u);
  for (uint32_t part = 0; part < 2; ++part) {
    EXPECT_EQ(m.dense_primary[part], 0) << "dense part " << part;
    EXPECT_EQ(m.dense_backup[part], 2) << "dense part " << part;
  }
  const Params fixed =
      ExpectSameAsFixedCluster(trainer, step, "through the loss and replacement of server 1");
  ExpectExactAfterKillingServerZero(trainer, fixed, 2);
}

// A server restarted under its old id (a StatefulSet pod keeps its ordinal and its volume):
// kill -9 of server 1 is failed over and its id retired; the same process restarted on its
// data dir registers again, and `scale 2` gives the id back its address and its share of the
// slots while the loop trains. Clients connect to it again; the loop ends bit-identical to a
// fixed cluster, and after kill -9 of server 0 the rows read from server 1 are still exact.
TEST_F(ReplicatedReshardTest, AServerRestartedUnderItsIdIsTakenBackWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  std::string out;
  const uint64_t step = TrainThroughTheLossOfServerOne(trainer, /*restart=*/true, &out);
  ASSERT_FALSE(HasFailure());
  std::printf("server 1 taken back in %llu steps: %s", static_cast<unsigned long long>(step),
              out.c_str());
  const ClusterMap m = LoadMap();
  EXPECT_FALSE(m.servers[1].address.empty());
  EXPECT_TRUE(m.servers.size() < 3 || m.servers[2].address.empty()) << "server 2 was not asked for";
  ExpectBackedUpEvenly(m, {0, 1}, "after scale 2");
  EXPECT_GT(Stat(1, "push_keys"), 0) << "the restarted server 1 took no push";
  const Params fixed =
      ExpectSameAsFixedCluster(trainer, step, "through the restart of server 1 under its id");
  ExpectExactAfterKillingServerZero(trainer, fixed, 1);
}

class AutoJoinTest : public ReshardTest {
 protected:
  void SetUp() override {
    StartCluster("--replication=2", {"--coordinator_ttl_s=2", "--auto_join"});
  }
};

// --auto_join: server 2, registered under the next unused id of a map of two, is taken in by
// the lowest live server (a scale to three, no tessera-ctl) while the loop trains; the loop
// ends bit-identical to a fixed cluster of two.
TEST_F(AutoJoinTest, AServerRegisteredUnderTheNextIdIsTakenInWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  auto joined = [&] {
    const ClusterMap m = LoadMap();
    if (m.servers.size() < 3 || m.servers[2].address.empty()) return false;
    uint32_t on2 = 0;
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      if (m.importing[slot] != ClusterMap::kNoServer || m.backup[slot] == ClusterMap::kNoServer) {
        return false;
      }
      on2 += m.primary[slot] == 2;
    }
    return on2 >= kNumSlots / 3;
  };
  uint64_t step = 0;
  for (; step < 30 || !joined(); ++step) {
    ASSERT_LT(step, 5000u) << "server 2 was not taken in";
    Status s = trainer.Step(step);
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
  }
  std::printf("server 2 taken in within %llu steps\n", static_cast<unsigned long long>(step));
  ExpectBackedUpEvenly(LoadMap(), {0, 1, 2}, "after the join");
  EXPECT_GT(Stat(2, "push_keys"), 0);
  ExpectSameAsFixedCluster(trainer, step, "through the join of server 2");
}

// An id a scale-down retired (its server drained, still registered: a StatefulSet pod that
// stays, or comes back under its ordinal) is given its address back by the next scale-up
// instead of a new id; clients that retired it connect to it again, and the loop ends
// bit-identical to a fixed cluster.
TEST_F(ReshardTest, AnIdRetiredByAScaleDownIsTakenBackByTheNextScaleUp) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  uint64_t step = 0;
  auto train = [&](int n) {
    for (int i = 0; i < n; ++i, ++step) {
      Status s = trainer.Step(step);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.ToString();
    }
  };
  std::string out;
  train(10);
  ASSERT_EQ(Scale(3, &out), 0) << out;
  train(5);
  ASSERT_EQ(Scale(2, &out), 0) << out;
  ASSERT_TRUE(Retired(2));
  train(5);
  const int64_t before = Stat(2, "push_keys");
  ASSERT_EQ(Scale(3, &out), 0) << out;
  train(10);
  const ClusterMap m = LoadMap();
  EXPECT_EQ(m.servers.size(), 3u) << "a new id was added instead";
  EXPECT_FALSE(Retired(2));
  EXPECT_EQ(std::count(m.primary.begin(), m.primary.end(), 2), kNumSlots / 3);
  EXPECT_GT(Stat(2, "push_keys"), before) << "server 2 took no push after it was taken back";
  ExpectSameAsFixedCluster(trainer, step, "through 2 -> 3 -> 2 -> 3");
}

class DrainTest : public ReshardTest {
 protected:
  void SetUp() override { StartCluster("", {"--drain_on_stop"}); }
};

// --drain_on_stop: SIGTERM of the map's highest server (what kubectl scale down of a
// StatefulSet sends) moves its slots to the others before it exits, while the loop trains
// (without a backup, a server leaving undrained would take its rows with it); the loop ends
// bit-identical to a fixed cluster of two.
TEST_F(DrainTest, ASigtermedHighestServerDrainsItselfWhileTraining) {
  auto client = TrainingClient();
  ASSERT_NE(client, nullptr);
  Trainer trainer(*client);
  uint64_t step = 0;
  auto train = [&] {
    Status s = trainer.Step(step++);
    EXPECT_TRUE(s.ok()) << "step " << step - 1 << ": " << s.ToString();
  };
  std::string out;
  for (int i = 0; i < 10; ++i) train();
  ASSERT_EQ(Scale(3, &out), 0) << out;
  for (int i = 0; i < 5; ++i) train();
  std::atomic<int> code{-2};
  std::thread stopper([&] { code = cluster_->Stop(2, 180); });
  while (code.load() == -2 && !HasFailure()) train();
  stopper.join();
  EXPECT_EQ(code.load(), 0);
  ASSERT_TRUE(Retired(2));
  for (int i = 0; i < 5; ++i) train();
  std::ifstream log(cluster_->log_path(2));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  const size_t drained = text.find("--drain_on_stop: drained");
  ASSERT_NE(drained, std::string::npos) << text;
  std::printf("%s\n", text.substr(drained, text.find('\n', drained) - drained).c_str());
  ExpectSameAsFixedCluster(trainer, step, "through 2 -> 3 and a drain on SIGTERM");
}

// The training job itself (tessera-worker --coordinator, BSP) rides through 2 -> 3 -> 2: it
// keeps training while slots move, server 2 serves its share meanwhile, and the job ends well.
TEST_F(ReshardTest, WorkerTrainsThroughTwoToThreeToTwo) {
  ChildProcess worker;
  ASSERT_TRUE(worker.Start({TESSERA_WORKER_BINARY, "--coordinator=" + url_, "--job=reshard",
                            "--consistency=bsp", "--train_samples=2000000",
                            "--test_samples=2000", "--batch_size=128", "--max_steps=4000",
                            "--synthetic_max_cardinality=20000", "--bottom_mlp=8",
                            "--top_mlp=8", "--request_timeout_ms=10000", "--retry_for_ms=60000",
                            "--out_dir=" + cluster_->dir()},
                           cluster_->dir() + "/worker.log"));
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "pushes") > 20 && Stat(1, "pushes") > 20; },
                      seconds(60)))
      << worker.Output();
  std::string up, down;
  ASSERT_EQ(Scale(3, &up), 0) << up;
  const int64_t before = Stat(2, "pushes");
  ASSERT_TRUE(WaitFor([&] { return Stat(2, "pushes") > before + 20; }, seconds(60)))
      << "server 2 took no pushes after the scale: " << worker.Output();
  ASSERT_EQ(Scale(2, &down), 0) << down;
  ASSERT_TRUE(worker.Running())
      << "the worker ended before the tier was back at 2 servers; raise --max_steps: "
      << worker.Output();
  ASSERT_EQ(worker.Wait(600), 0) << worker.Output();
  EXPECT_NE(worker.Output().find("4000 steps"), std::string::npos) << worker.Output();
  std::printf("scale 3: %sscale 2: %s", up.c_str(), down.c_str());
}

// The resharding ops refuse what they must, say why, change nothing, and the server goes on
// serving; tessera-ctl scale says what is missing.
TEST_F(ReshardTest, SlotOpsRefuseBadRequestsAndScaleNamesAMissingServer) {
  using Step = Client::SlotImportStep;
  const std::vector<uint32_t> owned = {0, 1, 2};  // server 0's at v1
  // Server 0 still owns these: nothing to export or drop.
  auto e = admin_->ExportSlots(0, 1, owned, {});
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("has not been given up"), std::string::npos)
      << e.status().ToString();
  EXPECT_EQ(admin_->DropSlots(0, 1, owned).code(), StatusCode::kFailedPrecondition);
  // A version the server has not seen: Unavailable, to be asked again.
  EXPECT_EQ(admin_->ExportSlots(1, 9, owned, {}).status().code(), StatusCode::kUnavailable);
  // Not importing anything: rows and done are refused.
  for (Step step : {Step::kRows, Step::kDone}) {
    Status s = admin_->ImportSlots(1, 1, owned, step, "");
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find("is not being copied to server 1"), std::string::npos)
        << s.ToString();
  }
  // The specs only (no slots) are fine, and damaged rows are not.
  auto specs = admin_->ExportSlots(0, 1, {}, {});
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_TRUE(admin_->ImportSlots(2, 0, {}, Step::kRows, *specs).ok());
  EXPECT_EQ(admin_->ImportSlots(2, 0, {}, Step::kRows, "R1234").code(), StatusCode::kCorruption);

  // Malformed frames: a slots frame that is not u32s, a slot past the last, a bad step.
  RawPeer peer(cluster_->endpoints()[1]);
  Header h;
  h.op = Op::kSlotExport;
  h.map_version = 1;
  Header r = peer.Call(h, {std::string(5, '\0')});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  const uint32_t past = kNumSlots;
  r = peer.Call(h, {std::string(reinterpret_cast<const char*>(&past), 4)});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  EXPECT_NE(r.message.find("16384"), std::string::npos) << r.message;
  r = peer.Call(h, {});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
  h.op = Op::kSlotImport;
  h.count = 7;
  r = peer.Call(h, {std::string()});
  EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;

  // A server that follows no map refuses them all.
  LocalCluster plain(Servers(1));
  ASSERT_TRUE(plain.Start().ok());
  RawPeer plain_peer(plain.endpoints()[0]);
  h.op = Op::kSlotExport;
  h.count = 0;
  r = plain_peer.Call(h, {std::string()});
  EXPECT_EQ(r.status, StatusCode::kFailedPrecondition) << r.message;
  EXPECT_NE(r.message.find("follows no cluster map"), std::string::npos) << r.message;

  // The servers still serve.
  auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
  ASSERT_TRUE(source.ok());
  auto client = Client::Create(TrainingOptions(), std::move(*source));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Trainer trainer(**client);
  ASSERT_TRUE(trainer.Step(0).ok());

  // Four servers need server id 3 registered: the command says how to start it, and nothing
  // moved (the map is still at version 1).
  std::string out;
  EXPECT_EQ(Scale(4, &out), 1) << out;
  EXPECT_NE(out.find("--rank=3"), std::string::npos) << out;
  std::string show;
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "show", "--coordinator=" + url_}, &show), 0);
  EXPECT_NE(show.find("version 1\n"), std::string::npos) << show;
  EXPECT_EQ(Scale(0, &out), 2) << out;
}

// A slot marked in (SlotImport done) takes pushes on its new owner: a controller that runs the
// move again (it died before settling) gets AlreadyExists instead of copying the old rows over
// them, also after the new owner restarts; the next scale settles the move without a copy.
TEST_F(ReshardTest, ASlotMarkedInIsNeverCopiedOverAndAScaleSettlesIt) {
  using Step = Client::SlotImportStep;
  SlotMapStore store(client_.get(), "/" + std::string(kPrefix));
  auto m = store.Load();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const uint32_t slot = 0;  // server 0's at v1
  ClusterMap next = *m;
  next.version = 2;
  next.primary[slot] = 1;
  next.importing[slot] = 0;
  ASSERT_TRUE(store.CompareAndSwap(1, next).ok());
  ASSERT_TRUE(WaitFor([&] { return Stat(0, "map_version") == 2 && Stat(1, "map_version") == 2; },
                      seconds(30)));
  const std::vector<uint32_t> slots = {slot};
  auto rows = admin_->ExportSlots(0, 2, slots, {});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_TRUE(admin_->ImportSlots(1, 2, slots, Step::kRows, *rows).ok());
  ASSERT_TRUE(admin_->ImportSlots(1, 2, slots, Step::kDone).ok());
  Status again = admin_->ImportSlots(1, 2, slots, Step::kRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  // Still so after a restart of the new owner (its RocksDB keeps the mark).
  EXPECT_EQ(cluster_->Stop(1), 0);
  ASSERT_TRUE(cluster_->Restart(1).ok());
  ASSERT_TRUE(WaitFor([&] { return Stat(1, "map_version") == 2; }, seconds(30)));
  again = admin_->ImportSlots(1, 2, slots, Step::kRows, *rows);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  // scale 2 finds the flipped slot, skips its copy, settles it (importing cleared) and drops
  // it from server 0.
  std::string out;
  ASSERT_EQ(Scale(2, &out), 0) << out;
  auto settled = store.Load();
  ASSERT_TRUE(settled.ok());
  EXPECT_EQ(settled->importing[slot], ClusterMap::kNoServer);
  EXPECT_EQ(settled->primary[slot], 1);
}

}  // namespace
}  // namespace tessera::testing
