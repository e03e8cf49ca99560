// The fixture of the online resharding tests (reshard_test.cc, dense_move_test.cc): three
// real tessera-server processes following a cluster map in a real etcd, `tessera-ctl scale`
// beside a 1-worker BSP training loop, and the same loop on a fixed 2-server cluster to compare
// with, bit for bit.
#pragma once

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

inline constexpr char kPrefix[] = "tessera/reshard";
inline constexpr uint32_t kDim = 8;
inline constexpr uint64_t kDenseLength = 6000;
inline constexpr uint64_t kKeySpace = 60000;
inline constexpr size_t kKeysPerStep = 400;
// How long a loop trains beside a scale (or a fail-over) before it gives up on it. A wall-time
// bound, not a step count: steps run as fast as the servers answer, and a bound of 5,000 steps
// raced the scale's own time (a server that answered faster reached it first on a loaded
// machine while the scale was still moving slots).
inline constexpr std::chrono::seconds kScaleWait{240};

// Whether a loop that started at `t0` may take another step.
inline bool WithinScaleWait(std::chrono::steady_clock::time_point t0) {
  return std::chrono::steady_clock::now() - t0 < kScaleWait;
}

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

inline ClientOptions TrainingOptions() {
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
inline void ExpectBitIdentical(const Params& got, const Params& want, const std::string& what) {
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

  // Three servers register (with `server_flags`); the map starts with `map_servers` of them,
  // `map_flag` added to map init.
  void StartCluster(const std::string& map_flag, const std::vector<std::string>& server_flags,
                    uint32_t map_servers = 2) {
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
    std::string servers;
    for (uint32_t i = 0; i < map_servers; ++i) {
      servers += (i == 0 ? "" : ",") + cluster_->endpoints()[i];
    }
    std::vector<std::string> init = {TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url_,
                                     "--servers=" + servers};
    if (!map_flag.empty()) init.push_back(map_flag);
    ASSERT_EQ(RunCommand(init, &out), 0) << out;
    ASSERT_TRUE(WaitFor(
        [&] {
          for (uint32_t i = 0; i < map_servers; ++i) {
            if (Stat(i, "map_version") < 1) return false;
          }
          return true;
        },
        std::chrono::seconds(30)));
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

  // Steps `trainer` (from *step on) while server `i` stops with SIGTERM, up to 180 s; its exit
  // code.
  int TrainWhileStopping(Trainer& trainer, uint64_t* step, uint32_t i) {
    std::atomic<int> code{-2};
    std::thread stopper([&] { code = cluster_->Stop(i, 180); });
    while (code.load() == -2 && !HasFailure()) {
      Status s = trainer.Step((*step)++);
      EXPECT_TRUE(s.ok()) << "step " << *step - 1 << ": " << s.ToString();
    }
    stopper.join();
    return code.load();
  }

  // The line of server `i`'s log that says it drained itself (--drain_on_stop); "" when none.
  std::string DrainedLine(uint32_t i) {
    std::ifstream log(cluster_->log_path(i));
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    const size_t at = text.find("--drain_on_stop: drained");
    EXPECT_NE(at, std::string::npos) << text;
    return at == std::string::npos ? "" : text.substr(at, text.find('\n', at) - at);
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
    ASSERT_TRUE(WaitFor([&] { return Retired(0); }, std::chrono::seconds(30))) << "server 0 was not failed over";
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
    const auto t0 = std::chrono::steady_clock::now();
    for (; step < 40 || !scaled.load(); ++step) {
      Status s = WithinScaleWait(t0) ? trainer.Step(step)
                                     : Status::DeadlineExceeded("the scale did not finish in time");
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
      EXPECT_TRUE(WithinScaleWait(t0)) << "the scaling did not finish: " << up_out << down_out;
      Status s = WithinScaleWait(t0) ? trainer.Step(step)
                                     : Status::DeadlineExceeded("the scaling did not finish in time");
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

}  // namespace tessera::testing
