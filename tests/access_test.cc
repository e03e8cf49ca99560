// Who may do what (issue 35, items 3 and 13; docs/operations.md, "Security"): real
// tessera-server processes with CurveZMQ keys made here. A key not in --authorized_clients is
// refused at the handshake; a listed client may push and pull but not checkpoint, abort a
// checkpoint, restore, export, export or drop slots or forge a forwarded push (each
// PermissionDenied, and no row changes); a key in --admin_clients may checkpoint and restore.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "ps/client/client.h"
#include "ps/curve.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::LocalCluster;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class CurveAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (CurveKeyPair* kp : {&server_, &peer_, &client_, &admin_, &stranger_}) {
      auto k = GenerateCurveKeyPair();
      if (!k.ok()) GTEST_SKIP() << "libzmq without CurveZMQ: " << k.status().ToString();
      *kp = *k;
    }
    dir_ = (fs::temp_directory_path() / ("tessera-access-" + std::to_string(getpid()))).string();
    fs::create_directories(dir_);
    Write("server.key", server_.secret_key + "\n");
    Write("peer.key", peer_.secret_key + "\n");
    Write("server.pub", server_.public_key + "\n");
    Write("admin.key", admin_.secret_key + "\n");
    Write("client.key", client_.secret_key + "\n");
    Write("clients", "# the workers\n" + client_.public_key + " worker-0\n\n");
    Write("admins", admin_.public_key + "\n");
    testing::LocalClusterOptions o = testing::Servers(2);
    o.extra_flags = {"--curve_secret_key_file=" + dir_ + "/server.key",
                     "--curve_peer_key_file=" + dir_ + "/peer.key",
                     "--authorized_clients=" + dir_ + "/clients",
                     "--admin_clients=" + dir_ + "/admins"};
    cluster_ = std::make_unique<LocalCluster>(o);
    Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  void TearDown() override {
    cluster_.reset();
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  ClientOptions Options(const std::string& secret_key) const {
    ClientOptions o;
    o.servers = cluster_->endpoints();
    o.curve_server_key = server_.public_key;
    o.curve_client_secret_key = secret_key;
    o.admin_root = cluster_->admin_root();
    o.connect_timeout_ms = 30000;
    o.retry_for_ms = 0;
    return o;
  }

  std::unique_ptr<Client> Connect(const std::string& secret_key) {
    auto c = Client::Create(Options(secret_key));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  CurveKeyPair server_, peer_, client_, admin_, stranger_;
  std::string dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(CurveAccessTest, KeyNotInAuthorizedClientsIsRefusedAtTheHandshake) {
  // A listed key and an admin key connect.
  ASSERT_NE(Connect(client_.secret_key), nullptr);
  ASSERT_NE(Connect(admin_.secret_key), nullptr);
  // Another key, and a fresh one (no key set), are refused by the ZAP handler: Create fails
  // with FailedPrecondition naming the list, not Unavailable after its 30 s connect timeout.
  for (const std::string& key : {stranger_.secret_key, std::string()}) {
    auto c = Client::Create(Options(key));
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
    EXPECT_TRUE(Contains(c.status().message(), "--authorized_clients")) << c.status().ToString();
  }
  // A key list the server cannot parse stops it at start (exit 2, naming the line).
  Write("bad", client_.public_key + "\nnot-a-key\n");
  std::string out;
  const int rc = testing::RunCommand(
      {TESSERA_SERVER_BINARY, "--cluster=tcp://127.0.0.1:" + std::to_string(testing::PickFreePort()),
       "--rank=0", "--curve_secret_key_file=" + dir_ + "/server.key",
       "--authorized_clients=" + dir_ + "/bad"},
      &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(Contains(out, "line 2")) << out;
}

TEST_F(CurveAccessTest, ListedClientMayTrainButNotTakePeerOrAdminOps) {
  auto c = Connect(client_.secret_key);
  ASSERT_NE(c, nullptr);
  OptimizerSpec sgd;
  sgd.learning_rate = 1.0f;
  auto t = c->CreateTable(TableSpec::Sparse("emb", 2, sgd));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; k <= 64; ++k) keys.push_back(k);  // rows on both servers
  std::vector<float> g(keys.size() * 2, 1.0f), before(g.size()), after(g.size());
  ASSERT_TRUE(c->Wait(c->Push(*t, keys, g)).ok());
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, before.data())).ok());
  EXPECT_EQ(before[0], -1.0f);
  auto denied = [](const Status& s, const std::string& op) {
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << op << ": " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), op)) << s.ToString();
  };
  denied(c->Checkpoint("ck").status(), "Checkpoint");
  denied(c->Restore("ck"), "Restore");
  denied(c->Export("exp", false).status(), "Export");
  std::vector<uint32_t> slots(64);
  for (uint32_t i = 0; i < slots.size(); ++i) slots[i] = i;
  for (uint32_t r = 0; r < 2; ++r) denied(c->DropSlots(r, 0, slots), "SlotDrop");
  Client::SlotExportRequest how;
  denied(c->ExportSlots(0, 0, slots, how).status(), "SlotExport");
  // Raw envelopes with the listed key: a checkpoint abort (count 1) and a forwarded push
  // (replica_from 2) of a large gradient to every row. (A static server would refuse that push
  // anyway, as it backs up nothing; tests/elastic/curve_replication_test.cc forges one where a
  // backup would apply it.)
  const testing::RawCurveKeys raw_keys{server_.public_key, client_.public_key, client_.secret_key};
  for (uint32_t r = 0; r < 2; ++r) {
    testing::RawPeer raw(cluster_->endpoints()[r], 10000, &raw_keys);
    Header abort;
    abort.op = Op::kCheckpoint;
    abort.count = 1;
    abort.name = "ck";
    Header reply = raw.Call(abort);
    EXPECT_EQ(reply.status, StatusCode::kPermissionDenied) << reply.message;
    Header fwd = testing::SparseHeader(Op::kSparsePush, t->id, keys.size(), 2);
    fwd.replica_from = 2 - r;
    std::vector<float> big(keys.size() * 2, 1000.0f);
    reply = raw.Call(fwd, {testing::Bytes(keys), testing::Bytes(big)});
    EXPECT_EQ(reply.status, StatusCode::kPermissionDenied) << reply.message;
    EXPECT_TRUE(Contains(reply.message, "forwarded")) << reply.message;
  }
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, after.data())).ok());
  EXPECT_EQ(after, before);
  // The admin key may checkpoint and restore; pushes go on meanwhile.
  auto admin = Connect(admin_.secret_key);
  ASSERT_NE(admin, nullptr);
  auto cut = admin->Checkpoint("ck");
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  ASSERT_TRUE(c->Wait(c->Push(*t, keys, g)).ok());
  Status restored = admin->Restore("ck");
  ASSERT_TRUE(restored.ok()) << restored.ToString();
  ASSERT_TRUE(c->Wait(c->Pull(*t, keys, after.data())).ok());
  EXPECT_EQ(after, before);
  // An admin is no server: it may not forward pushes either.
  const testing::RawCurveKeys admin_keys{server_.public_key, admin_.public_key, admin_.secret_key};
  testing::RawPeer raw(cluster_->endpoints()[0], 10000, &admin_keys);
  Header fwd = testing::SparseHeader(Op::kSparsePush, t->id, 1, 2);
  fwd.replica_from = 2;
  const Header reply = raw.Call(fwd, {testing::Bytes(std::vector<uint64_t>{1}),
                                      testing::Bytes(std::vector<float>{5, 5})});
  EXPECT_EQ(reply.status, StatusCode::kPermissionDenied) << reply.message;
}

// tessera-ctl presents its key with --curve_client_key_file: a listed client's key connects but
// may not checkpoint, the admin key may.
TEST_F(CurveAccessTest, TesseraCtlCheckpointsWithTheAdminKeyOnly) {
  const auto& eps = cluster_->endpoints();
  const std::vector<std::string> base = {
      TESSERA_CTL_BINARY, "--cluster=" + eps[0] + "," + eps[1],
      "--curve_server_key_file=" + dir_ + "/server.pub", "--admin_root=" + cluster_->admin_root(),
      "--timeout_s=60"};
  std::vector<std::string> plain = base, admin = base;
  plain.insert(plain.end(), {"--curve_client_key_file=" + dir_ + "/client.key", "checkpoint", "ck"});
  admin.insert(admin.end(), {"--curve_client_key_file=" + dir_ + "/admin.key", "checkpoint", "ck"});
  std::string out;
  EXPECT_EQ(testing::RunCommand(plain, &out), 1) << out;
  EXPECT_TRUE(Contains(out, "PermissionDenied")) << out;
  EXPECT_EQ(testing::RunCommand(admin, &out), 0) << out;
  EXPECT_TRUE(Contains(out, "checkpoint written to ck")) << out;
}

// Without CurveZMQ the key lists mean nothing: a server given one refuses to start.
TEST(AccessFlags, KeyListsNeedCurve) {
  for (const char* flag : {"--authorized_clients=x", "--admin_clients=x", "--curve_peer_key_file=x"}) {
    std::string out;
    const int rc = testing::RunCommand(
        {TESSERA_SERVER_BINARY,
         "--cluster=tcp://127.0.0.1:" + std::to_string(testing::PickFreePort()), "--rank=0", flag},
        &out);
    EXPECT_EQ(rc, 2) << flag << ": " << out;
    EXPECT_TRUE(Contains(out, "needs --curve_secret_key_file")) << out;
  }
}

}  // namespace
}  // namespace tessera
