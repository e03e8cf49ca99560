// The standing randomized fault test (issue 35): real tessera-server processes, one client whose
// every push is identifiable (push_ledger.h), and a scheduler that picks faults at random from a
// seeded generator while the client pushes. Afterwards every acknowledged push must be found
// applied exactly once, every other push at most once, each slot's part of a push all or
// nothing, no call without a final result past its deadline, and (with etcd) the map fully
// backed up again within kBackupBoundS of each fault.
//
//  - StaticCluster: three servers of a --cluster list (no etcd) with RocksDB data dirs; kill -9
//    and restart, SIGSTOP then SIGCONT, SIGTERM and restart, kill -9 of two at once.
//  - Replicated: three servers with etcd and `map init --replication=2`; kill -9 (fail-over,
//    rebuild, the server restarted and given its id back by `tessera-ctl scale 3`), SIGSTOP
//    shorter than the lease, SIGSTOP past the lease (fail-over of a server that still runs),
//    `tessera-ctl scale 2` then `scale 3` while the client pushes, and (soak only) kill -9 of
//    a server during `scale 2`.
//
// TESSERA_FAULT_SEED replays a run (the seed is printed); TESSERA_FAULT_ROUNDS sets the rounds.
// The binary random_faults_test (label faults) runs a few rounds; random_faults_soak_test
// (label soak, the same source with TESSERA_FAULT_SOAK) many more.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "ps/client/client.h"
#include "ps/coord/cluster_map.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/push_ledger.h"
#include "tests/elastic/replicated_cluster.h"

namespace tessera::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The soak also kills a server while `scale 2` runs: that scale then waits out its
// --timeout_s (issue 35, item 15), too long for the default run.
#ifdef TESSERA_FAULT_SOAK
constexpr uint64_t kStaticRounds = 200, kReplicatedRounds = 40, kReplicatedActions = 5;
#else
constexpr uint64_t kStaticRounds = 20, kReplicatedRounds = 2, kReplicatedActions = 4;
#endif
// The bound on the time from a fault to a map whose every slot and dense part has a live
// primary and a live backup again (fail-over, rebuild, restart and `scale 3` included; a
// `scale` that a death interrupted may take its whole --timeout_s=240 first).
constexpr int kBackupBoundS = 400;
// The client's retry window; a push with no final result this long after it was sent plus
// kHangSlackMs is counted as hung.
constexpr int64_t kRetryForMs = 60000, kHangSlackMs = 30000;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t Seed() {
  static const uint64_t seed = EnvOr("TESSERA_FAULT_SEED", std::random_device{}());
  return seed;
}

// The fault thread's log line, with the time since the run started.
class Log {
 public:
  void operator()(const std::string& what) const {
    std::printf("  [%7.1f s] %s\n", MsSince(start_) / 1000, what.c_str());
    std::fflush(stdout);
  }

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void SleepMs(std::mt19937_64& rng, int lo, int hi) {
  std::this_thread::sleep_for(milliseconds(lo + static_cast<int>(rng() % (hi - lo + 1))));
}

// Runs `faults` on a thread while `ledger` pushes on this one (a push every `pause` at most),
// then verifies through `reader`.
template <typename Faults>
void PushWhile(PushLedger& ledger, Faults faults,
               const std::function<std::unique_ptr<Client>()>& reader,
               milliseconds pause = milliseconds(0)) {
  std::atomic<bool> done{false}, verified{false};
  // The servers the fault thread restarts die with it (SpawnChild's PR_SET_PDEATHSIG follows
  // the thread that forked them), so it lives until the table has been read back.
  std::thread scheduler([&] {
    faults();
    done = true;
    while (!verified.load()) std::this_thread::sleep_for(milliseconds(20));
  });
  while (!done.load()) {
    ledger.Send();
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
  ledger.Drain();
  auto r = reader();
  Status s = r != nullptr ? ledger.Verify(*r) : Status::Unavailable("no reader client");
  verified = true;
  scheduler.join();
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// The end of each server's log, after a failure (the cluster's directory goes with it).
void PrintLogTails(const LocalCluster& cluster, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    std::string out;
    RunCommand({"/usr/bin/tail", "-n", "25", cluster.log_path(i)}, &out, 10);
    std::printf("---- end of server %u's log:\n%s", i, out.c_str());
  }
}

void ExpectClean(const FaultFigures& f) {
  EXPECT_EQ(f.lost, 0u);
  EXPECT_EQ(f.doubled, 0u);
  EXPECT_EQ(f.torn, 0u);
  EXPECT_EQ(f.hung, 0u);
  EXPECT_EQ(f.contradicted, 0u);
  EXPECT_GT(f.acknowledged, 0u);
}

TEST(RandomFaults, StaticClusterKillStopRestart) {
  const uint64_t seed = Seed();
  const uint64_t rounds = EnvOr("TESSERA_FAULT_ROUNDS", kStaticRounds);
  std::printf("TESSERA_FAULT_SEED=%llu TESSERA_FAULT_ROUNDS=%llu\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds));
  LocalClusterOptions o = Servers(3);
  o.with_data_dirs = true;  // acknowledged means in the request log: it survives kill -9
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions co;
  co.servers = cluster.endpoints();
  co.request_timeout_ms = 2000;  // a stopped server's pushes are sent again (same number)
  co.retry_for_ms = kRetryForMs;
  auto client = Client::Create(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  auto table = (*client)->CreateTable(TableSpec::Sparse("faults", PushLedger::kDim, sgd));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  PushLedger ledger(**client, *table, seed, kRetryForMs + kHangSlackMs);

  std::mt19937_64 rng(seed ^ 0x5a5a);
  Log log;
  auto faults = [&] {
    for (uint64_t round = 0; round < rounds; ++round) {
      SleepMs(rng, 100, 600);
      const uint32_t i = rng() % 3, j = (i + 1 + rng() % 2) % 3;
      Status s;
      switch (rng() % 4) {
        case 0:
          log("round " + std::to_string(round) + ": kill -9 server " + std::to_string(i));
          cluster.Kill(i);
          SleepMs(rng, 0, 1000);
          s = cluster.Restart(i);
          break;
        case 1:
          log("round " + std::to_string(round) + ": SIGSTOP server " + std::to_string(i));
          kill(cluster.pid(i), SIGSTOP);
          SleepMs(rng, 200, 3000);  // longer than the client's request timeout at times
          kill(cluster.pid(i), SIGCONT);
          break;
        case 2:
          log("round " + std::to_string(round) + ": SIGTERM server " + std::to_string(i));
          cluster.Stop(i);
          s = cluster.Restart(i);
          break;
        default:
          log("round " + std::to_string(round) + ": kill -9 servers " + std::to_string(i) +
              " and " + std::to_string(j));
          cluster.Kill(i);
          cluster.Kill(j);
          SleepMs(rng, 0, 500);
          s = cluster.Restart(i);
          if (s.ok()) s = cluster.Restart(j);
      }
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) return;
      ledger.figures.rounds = round + 1;
    }
    SleepMs(rng, 300, 300);
  };
  PushWhile(ledger, faults, [&]() -> std::unique_ptr<Client> {
    auto r = Client::Create(co);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  });
  ledger.figures.Print("static cluster", seed);
  ExpectClean(ledger.figures);
  if (::testing::Test::HasFailure()) PrintLogTails(cluster, 3);
}

constexpr char kPrefix[] = "tessera/faults";

class ReplicatedRandomFaults : public ReplicatedClusterTest {
 protected:
  ReplicatedRandomFaults() : ReplicatedClusterTest(kPrefix) {}

  // Every one of `n` servers is live, and every slot and dense part has a live primary and a
  // live backup, with no copy under way.
  bool FullyBackedUp(uint32_t n) {
    auto m = store_->Load();
    if (!m.ok()) return false;
    auto live = [&](uint16_t id) {
      return id < m->servers.size() && !m->servers[id].address.empty();
    };
    uint32_t servers = 0;
    for (uint16_t id = 0; id < m->servers.size(); ++id) servers += live(id);
    if (servers != n) return false;
    for (uint32_t slot = 0; slot < kNumSlots; ++slot) {
      const uint16_t p = m->primary[slot], b = m->backup[slot];
      if (!live(p) || !live(b) || p == b) return false;
      if (!m->importing.empty() && m->importing[slot] != ClusterMap::kNoServer) return false;
    }
    for (uint32_t part = 0; part < m->dense_servers; ++part) {
      if (part >= m->dense_primary.size() || part >= m->dense_backup.size()) return false;
      const uint16_t p = m->dense_primary[part], b = m->dense_backup[part];
      if (!live(p) || !live(b) || p == b) return false;
      if (part < m->dense_importing.size() && m->dense_importing[part] != ClusterMap::kNoServer) {
        return false;
      }
    }
    return true;
  }

  bool Retired(uint32_t id) {
    auto m = store_->Load();
    return m.ok() && m->servers.size() > id && m->servers[id].address.empty();
  }

  int Scale(uint32_t n, std::string* out) {
    return RunCommand({TESSERA_CTL_BINARY, "scale", std::to_string(n), "--coordinator=" + url_,
                       "--timeout_s=240"},
                      out, 300);
  }

  // Brings the cluster back to three live servers with every slot backed up: a retired server
  // is killed (a server whose lease was lost never registers again) and restarted, and
  // `tessera-ctl scale 3` gives its id back (tried again while a rebuild holds the
  // controller). Returns whether the map was fully backed up within kBackupBoundS of `fault`.
  bool Heal(std::chrono::steady_clock::time_point fault, const Log& log, FaultFigures* f) {
    const auto end = fault + seconds(kBackupBoundS);
    bool restarted = false;
    for (uint32_t i = 0; i < 3; ++i) {
      if (!Retired(i) && cluster_->running(i)) continue;
      log("restart server " + std::to_string(i));
      if (!cluster_->Restart(i).ok()) return false;
      restarted = true;
    }
    while (restarted && !FullyBackedUp(3) && std::chrono::steady_clock::now() < end) {
      std::string out;
      const int rc = Scale(3, &out);
      log("tessera-ctl scale 3: exit " + std::to_string(rc));
      if (rc == 0) break;
      std::printf("%s", out.c_str());
      std::this_thread::sleep_for(seconds(1));
    }
    const bool ok = WaitFor([&] { return FullyBackedUp(3); },
                            std::chrono::duration_cast<milliseconds>(
                                end - std::chrono::steady_clock::now()));
    f->max_backup_ms = std::max(f->max_backup_ms, MsSince(fault));
    log(ok ? "fully backed up" : "NOT fully backed up within the bound");
    return ok;
  }
};

TEST_F(ReplicatedRandomFaults, FailOverRebuildAndScale) {
  const uint64_t seed = Seed();
  const uint64_t rounds = EnvOr("TESSERA_FAULT_ROUNDS", kReplicatedRounds);
  std::printf("TESSERA_FAULT_SEED=%llu TESSERA_FAULT_ROUNDS=%llu\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(rounds));
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  auto table = c->CreateTable(TableSpec::Sparse("faults", PushLedger::kDim, sgd));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  PushLedger ledger(*c, *table, seed, kRetryForMs + kHangSlackMs);
  ASSERT_TRUE(FullyBackedUp(3));

  std::mt19937_64 rng(seed ^ 0xa5a5);
  Log log;
  auto faults = [&] {
    for (uint64_t round = 0; round < rounds; ++round) {
      SleepMs(rng, 300, 1500);
      const uint32_t i = rng() % 3;
      const auto fault = std::chrono::steady_clock::now();
      const std::string r = "round " + std::to_string(round) + ": ";
      switch (rng() % kReplicatedActions) {
        case 0:
          log(r + "kill -9 server " + std::to_string(i));
          cluster_->Kill(i);
          EXPECT_TRUE(WaitFor([&] { return Retired(i); }, seconds(60))) << "no fail-over";
          break;
        case 1:
          log(r + "SIGSTOP server " + std::to_string(i) + " within its lease");
          kill(cluster_->pid(i), SIGSTOP);
          SleepMs(rng, 200, 1000);
          kill(cluster_->pid(i), SIGCONT);
          break;
        case 2:
          log(r + "SIGSTOP server " + std::to_string(i) + " past its lease");
          kill(cluster_->pid(i), SIGSTOP);
          EXPECT_TRUE(WaitFor([&] { return Retired(i); }, seconds(60))) << "no fail-over";
          kill(cluster_->pid(i), SIGCONT);
          break;
        case 3: {
          log(r + "tessera-ctl scale 2");
          std::string out;
          const int rc = Scale(2, &out);
          log("tessera-ctl scale 2: exit " + std::to_string(rc));
          EXPECT_EQ(rc, 0) << out;
          break;
        }
        default: {
          // A scale that a death interrupts: it may fail (the fail-over's map wins), the next
          // `scale 3` of Heal finishes what it left.
          const uint32_t victim = rng() % 3;
          log(r + "tessera-ctl scale 2, kill -9 of server " + std::to_string(victim) +
              " while it runs");
          std::string out;
          int rc = -1;
          std::thread scaler([&] { rc = Scale(2, &out); });
          SleepMs(rng, 200, 3000);
          cluster_->Kill(victim);
          scaler.join();
          log("the interrupted scale 2: exit " + std::to_string(rc) + ", " +
              out.substr(0, out.find('\n')));
          // Retired by the scale or by a fail-over (a quick restart would not be one).
          EXPECT_TRUE(WaitFor([&] { return Retired(victim); }, seconds(60))) << "no fail-over";
        }
      }
      const bool healed = Heal(fault, log, &ledger.figures);
      EXPECT_TRUE(healed) << "round " << round << ": the map was not fully backed up within "
                          << kBackupBoundS << " s";
      if (!healed) return;
      ledger.figures.rounds = round + 1;
    }
  };
  // At most 40 pushes a second: the rows a rebuild or a scale copies grow by at most 640 a
  // second (each push adds 16), and a scale's time grows with them.
  PushWhile(ledger, faults, [&] { return CoordinatorClient(); }, milliseconds(25));
  ledger.figures.Print("replicated (etcd, --replication=2)", seed);
  ExpectClean(ledger.figures);
  if (HasFailure()) PrintLogTails(*cluster_, 3);
}

}  // namespace
}  // namespace tessera::testing
