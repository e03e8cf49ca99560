// A replicated cluster with CurveZMQ (issue 35, item 13; docs/operations.md, "Security"): three
// tessera-server processes with --coordinator in a real etcd, a map with a backup for every
// slot, a server key, a peer key and allow-lists. The primaries' links present the peer key,
// which the backups let forward pushes, so replication works: after kill -9 of a primary the
// promoted backup serves every acknowledged push. A listed client may not forward one itself.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "ps/client/client.h"
#include "ps/coord/etcd_map_source.h"
#include "ps/coord/slot_map_store.h"
#include "ps/curve.h"
#include "ps/routing.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/raw_peer.h"

namespace tessera::testing {
namespace {

namespace fs = std::filesystem;
constexpr char kPrefix[] = "tessera/curve";

class CurveReplicationTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (CurveKeyPair* kp : {&server_, &peer_, &worker_, &admin_}) {
      auto k = GenerateCurveKeyPair();
      if (!k.ok()) GTEST_SKIP() << "libzmq without CurveZMQ: " << k.status().ToString();
      *kp = *k;
    }
    dir_ = (fs::temp_directory_path() / ("tessera-curve-repl-" + std::to_string(getpid())))
               .string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/server.key") << server_.secret_key << "\n";
    std::ofstream(dir_ + "/peer.key") << peer_.secret_key << "\n";
    std::ofstream(dir_ + "/clients") << worker_.public_key << "\n";
    std::ofstream(dir_ + "/admins") << admin_.public_key << "\n";
    url_ = etcd_.url(kPrefix);
    LocalClusterOptions o = Servers(3);
    o.with_data_dirs = true;
    o.extra_flags = {"--coordinator=" + url_, "--coordinator_ttl_s=2",
                     "--curve_secret_key_file=" + dir_ + "/server.key",
                     "--curve_peer_key_file=" + dir_ + "/peer.key",
                     "--authorized_clients=" + dir_ + "/clients",
                     "--admin_clients=" + dir_ + "/admins"};
    cluster_ = std::make_unique<LocalCluster>(o);
    Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::string servers, out;
    for (const auto& e : cluster_->endpoints()) servers += (servers.empty() ? "" : ",") + e;
    ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "map", "init", "--coordinator=" + url_,
                          "--servers=" + servers, "--replication=2"},
                         &out),
              0)
        << out;
    ClientOptions a = Options(admin_.secret_key);
    a.servers = cluster_->endpoints();
    auto admin = Client::Create(a);
    ASSERT_TRUE(admin.ok()) << admin.status().ToString();
    admin_client_ = std::move(*admin);
    ASSERT_TRUE(WaitFor(
        [&] {
          for (uint32_t r = 0; r < 3; ++r) {
            if (Stat(r, "map_version") != 1) return false;
          }
          return true;
        },
        std::chrono::seconds(30)))
        << "the servers did not take map version 1";
  }

  void TearDown() override {
    admin_client_.reset();
    cluster_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  ClientOptions Options(const std::string& secret_key) const {
    ClientOptions o;
    o.curve_server_key = server_.public_key;
    o.curve_client_secret_key = secret_key;
    o.request_timeout_ms = 2000;
    o.retry_for_ms = 60000;
    return o;
  }

  // A client of the map in etcd with `secret_key`.
  std::unique_ptr<Client> MapClient(const std::string& secret_key) {
    auto source = EtcdClusterMapSource::Create(*CoordinatorUrl::Parse(url_));
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    if (!source.ok()) return nullptr;
    auto c = Client::Create(Options(secret_key), std::move(*source));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  int64_t Stat(uint32_t r, const std::string& key) {
    auto st = admin_client_->ServerStats(r);
    return st.ok() ? StatOf(*st, key) : -1;
  }

  CurveKeyPair server_, peer_, worker_, admin_;
  std::string dir_, url_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> admin_client_;
};

TEST_F(CurveReplicationTest, PeerKeyReplicatesAndABackupServesAfterTheKill) {
  auto c = MapClient(worker_.secret_key);
  ASSERT_NE(c, nullptr);
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;  // zeros initializer: a row reads minus the sum of its gradients
  auto t = c->CreateTable(TableSpec::Sparse("emb", 2, sgd));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  // Keys of server 1's slots at version 1 (uniform over 3; server 2 is their backup).
  const SlotMap uniform = SlotMap::Uniform(3);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < 200; ++k) {
    if (uniform.ServerOfKey(k) == 1) keys.push_back(k);
  }
  std::vector<float> g(keys.size() * 2, 1.0f);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->Wait(c->Push(*t, keys, g)).ok());
  EXPECT_GE(Stat(1, "replicated_pushes"), 3);
  EXPECT_EQ(Stat(1, "failed_replications"), 0);
  // The authorized client presents its own key: the backup refuses a push it forwards itself.
  const RawCurveKeys raw_keys{server_.public_key, worker_.public_key, worker_.secret_key};
  RawPeer raw(cluster_->endpoints()[2], 10000, &raw_keys);
  Header fwd = SparseHeader(Op::kSparsePush, t->id, keys.size(), 2);
  fwd.replica_from = 2;  // server 1
  fwd.map_version = 1;
  std::vector<float> big(keys.size() * 2, 1000.0f);
  const Header reply = raw.Call(fwd, {Bytes(keys), Bytes(big)});
  EXPECT_EQ(reply.status, StatusCode::kPermissionDenied) << reply.message;
  // kill -9 of the primary: its backup is promoted and serves the three pushes, once each.
  cluster_->Kill(1);
  SlotMapStore store(client_.get(), std::string("/") + kPrefix);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store.Load();
        return m.ok() && std::find(m->primary.begin(), m->primary.end(), 1) == m->primary.end();
      },
      std::chrono::seconds(60)))
      << "server 1's slots were not promoted";
  auto reader = MapClient(worker_.secret_key);
  ASSERT_NE(reader, nullptr);
  std::vector<float> out(keys.size() * 2);
  Status s = reader->Wait(reader->Pull(*t, keys, out.data()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, std::vector<float>(out.size(), -3.0f));
}

}  // namespace
}  // namespace tessera::testing
