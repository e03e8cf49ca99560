// A client that follows a cluster map with thousands of server ids, nearly all retired (issue
// 35, item 7): it opens sockets only for the ids with an address, so the map costs no
// descriptors for the others; and running out of descriptors is a Status, never an abort.
// The map comes from an in-memory ClusterMapSource; the two live ids are real tessera-server
// processes on 127.0.0.1.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/cluster_map_source.h"
#include "ps/routing.h"
#include "ps/table_spec.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

// A source with one map and no later versions.
class FixedMapSource final : public ClusterMapSource {
 public:
  explicit FixedMapSource(RoutingMap m) : map_(std::move(m)) {}
  Result<RoutingMap> Load() override { return map_; }
  Status Watch(RoutingMapCallback callback) override {
    callback(map_);
    return Status::OK();
  }

 private:
  const RoutingMap map_;
};

OptimizerSpec Sgd(float lr) {
  OptimizerSpec o;
  o.kind = OptimizerKind::kSgd;
  o.learning_rate = lr;
  return o;
}

// 5,000 server ids; only the last two have addresses (servers 0 and 1 of `endpoints`, which
// own the slots and dense parts of a static 2-server cluster: ids 4998 and 4999 take their
// places, as after many fail-overs and scale-downs).
RoutingMap ManyRetiredIds(const std::vector<std::string>& endpoints) {
  constexpr uint32_t kIds = 5000;
  constexpr uint16_t kFirstLive = kIds - 2;
  RoutingMap m;
  m.version = 7;
  m.addresses.assign(kIds, "");
  m.addresses[kFirstLive] = endpoints[0];
  m.addresses[kFirstLive + 1] = endpoints[1];
  std::vector<uint16_t> owners = SlotMap::Uniform(2).owners();
  for (uint16_t& o : owners) o = static_cast<uint16_t>(o + kFirstLive);
  m.primary = *SlotMap::FromOwners(std::move(owners), kIds);
  m.dense_servers = 2;
  m.dense_primary = {kFirstLive, kFirstLive + 1};
  return m;
}

TEST(ClientMapSizeTest, AMapOfFiveThousandIdsMostlyRetiredPushesAndPulls) {
  testing::LocalCluster cluster(testing::Servers(2));
  ASSERT_TRUE(cluster.Start().ok());
  auto source = std::make_unique<FixedMapSource>(ManyRetiredIds(cluster.endpoints()));
  auto created = Client::Create(ClientOptions{}, std::move(source));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Client& c = **created;

  auto sparse = c.CreateTable(TableSpec::Sparse("emb", 4, Sgd(1.0f)));
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 200; ++k) keys.push_back(k * 7919);  // slots of both servers
  std::vector<float> before(keys.size() * 4), after(keys.size() * 4), grads(keys.size() * 4);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 5) - 2.0f;
  ASSERT_TRUE(c.Wait(c.Pull(*sparse, keys, before.data())).ok());
  ASSERT_TRUE(c.Wait(c.Push(*sparse, keys, grads)).ok());
  ASSERT_TRUE(c.Wait(c.Pull(*sparse, keys, after.data())).ok());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_FLOAT_EQ(after[i], before[i] - grads[i]) << "element " << i;
  }

  auto dense = c.CreateTable(TableSpec::Dense("mlp", 1000, Sgd(1.0f)));
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  std::vector<float> d0(1000), d1(1000), dg(1000, 0.5f);
  ASSERT_TRUE(c.Wait(c.DensePull(*dense, 0, 1000, d0.data())).ok());
  ASSERT_TRUE(c.Wait(c.DensePush(*dense, 0, dg)).ok());
  ASSERT_TRUE(c.Wait(c.DensePull(*dense, 0, 1000, d1.data())).ok());
  for (size_t i = 0; i < d1.size(); ++i) ASSERT_FLOAT_EQ(d1[i], d0[i] - 0.5f) << "element " << i;
  EXPECT_TRUE(c.Wait(c.Clock()).ok());
}

int OpenDescriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// Runs in a child process (a death test): lowers the descriptor limit to a few dozen above
// what is open, then asks for a client of 200 servers (nothing need listen: the sockets run
// out before any is pinged). Exits 0 when Create answered ResourceExhausted.
[[noreturn]] void CreateWithFewDescriptors() {
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = static_cast<rlim_t>(OpenDescriptors() + 40);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) std::exit(3);
  ClientOptions o;
  o.servers.assign(200, "tcp://127.0.0.1:" + std::to_string(testing::PickFreePort()));
  o.connect_timeout_ms = 1000;
  auto c = Client::Create(o);
  if (c.ok()) std::exit(1);
  fprintf(stderr, "%s\n", c.status().ToString().c_str());
  std::exit(c.status().code() == StatusCode::kResourceExhausted ? 0 : 2);
}

TEST(ClientMapSizeTest, RunningOutOfDescriptorsIsAStatusNotAnAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CreateWithFewDescriptors(), ::testing::ExitedWithCode(0), "ResourceExhausted");
}

}  // namespace
}  // namespace tessera
