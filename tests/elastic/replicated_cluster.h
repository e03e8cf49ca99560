// The fixture of the replication tests (docs/elasticity.md): three real tessera-server
// processes with --coordinator in a real etcd (lease TTL kTtlS), RocksDB data dirs, and a map
// made by `tessera-ctl map init --replication=2` (every slot and dense part has a backup, the
// next server). A test binary that includes it defines TESSERA_CTL_BINARY.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/coord/cluster_map.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/slot_map_store.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"

namespace tessera::testing {

inline constexpr uint32_t kDim = 4;
inline constexpr int kTtlS = 2;

class ReplicatedClusterTest : public EtcdTest {
 protected:
  explicit ReplicatedClusterTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    url_ = etcd_.url(prefix_);
    cluster_ = StartReplicated(url_);
    ASSERT_NE(cluster_, nullptr);
    admin_ = AdminClient(cluster_->endpoints());
    ASSERT_NE(admin_, nullptr);
    store_ = std::make_unique<SlotMapStore>(client_.get(), "/" + prefix_);
  }

  // Three servers following the map at `url` (`o` gives the rest: an admin root, more flags;
  // server_flags_ are added), with data
  // dirs (acknowledged means in RocksDB's log on two servers), once `tessera-ctl map init
  // --replication=2` made version 1 and each server serves it; null after a test failure.
  std::unique_ptr<LocalCluster> StartReplicated(const std::string& url,
                                                LocalClusterOptions o = Servers(3)) {
    o.with_data_dirs = true;
    std::vector<std::string> flags = {"--coordinator=" + url,
                                      "--coordinator_ttl_s=" + std::to_string(kTtlS)};
    flags.insert(flags.end(), o.extra_flags.begin(), o.extra_flags.end());
    flags.insert(flags.end(), server_flags_.begin(), server_flags_.end());
    o.extra_flags = std::move(flags);
    auto cluster = std::make_unique<LocalCluster>(o);
    Status s = cluster->Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto admin = AdminClient(cluster->endpoints());
    if (!s.ok() || admin == nullptr) return nullptr;
    std::string servers;
    for (const auto& e : cluster->endpoints()) servers += (servers.empty() ? "" : ",") + e;
    std::string out;
    const int rc = RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url,
                               "--servers=" + servers, "--replication=2"},
                              &out);
    EXPECT_EQ(rc, 0) << out;
    const bool serving = rc == 0 && WaitFor(
        [&] {
          for (uint32_t r = 0; r < o.num_servers; ++r) {
            auto st = admin->ServerStats(r);
            if (!st.ok() || StatOf(*st, "map_version") != 1) return false;
          }
          return true;
        },
        std::chrono::seconds(30));
    EXPECT_TRUE(serving) << "the servers did not take map version 1";
    return serving ? std::move(cluster) : nullptr;
  }

  int64_t ServerStat(uint32_t r, const std::string& key) {
    auto st = admin_->ServerStats(r);
    return st.ok() ? StatOf(*st, key) : -1;
  }

  // A client of the map (a short request timeout: what a dead server does not answer is sent
  // again soon); worker `worker_id` of `num_workers` when that is not 0; the map at `url`
  // (default: the fixture's).
  std::unique_ptr<Client> CoordinatorClient(uint32_t worker_id = 0, uint32_t num_workers = 0,
                                            const std::string& url = "") {
    auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url.empty() ? url_ : url));
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    if (!source.ok()) return nullptr;
    ClientOptions o;
    o.request_timeout_ms = 2000;
    o.retry_for_ms = 60000;
    o.worker_id = worker_id;
    o.consistency.num_workers = num_workers;
    auto c = Client::Create(o, std::move(*source));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  static Table Sparse(Client& c, const std::string& name) {
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;  // zeros initializer: the sum of the pushed gradients, negated
    auto t = c.CreateTable(TableSpec::Sparse(name, kDim, sgd));
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? *t : Table{};
  }

  // The first `n` keys whose slot `server` is the primary of at map version 1 (uniform).
  static std::vector<uint64_t> KeysOf(uint32_t server, size_t n) {
    const SlotMap m = SlotMap::Uniform(3);
    std::vector<uint64_t> keys;
    for (uint64_t k = 1; keys.size() < n; ++k) {
      if (m.ServerOfKey(k) == server) keys.push_back(k);
    }
    return keys;
  }

  // Waits until the stored map no longer names `server` the primary of any slot.
  bool WaitForPromotion(uint32_t server, std::chrono::milliseconds limit) {
    return WaitFor(
        [&] {
          auto m = store_->Load();
          if (!m.ok()) return false;
          for (uint16_t p : m->primary) {
            if (p == server) return false;
          }
          return true;
        },
        limit);
  }

  // More flags of every server StartReplicated starts (a derived fixture's constructor sets
  // them, e.g. --rebuild_backups=false).
  std::vector<std::string> server_flags_;
  std::string prefix_;
  std::string url_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> admin_;
  std::unique_ptr<SlotMapStore> store_;
};

}  // namespace tessera::testing
