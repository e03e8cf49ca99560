// DropTable through real tessera-server processes: the table leaves every server, its rows leave
// memory and RocksDB (a table created again under the name starts empty, with another spec,
// also across a restart), other tables keep theirs, and a drop a crash cut short is finished at
// the next start.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ps/client/client.h"
#include "ps/server/server.h"
#include "ps/table_spec.h"
#include "storage/storage.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"

namespace tessera {
namespace {

using testing::LocalCluster;

constexpr int kKeys = 2000;

std::vector<uint64_t> Keys() {
  std::vector<uint64_t> k(kKeys);
  for (int i = 0; i < kKeys; ++i) k[i] = 1000003ull * static_cast<uint64_t>(i) + 7;
  return k;
}

// SGD with learning rate 1 from zeros: a gradient of -1 makes a value 1.
TableSpec SparseSpec(const std::string& name, uint32_t dim) {
  return TableSpec::Sparse(name, dim, {OptimizerKind::kSgd, 1.0f});
}

void PushOnes(Client& c, const Table& t) {
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> grads(keys.size() * t.spec.dim, -1.0f);
  ASSERT_TRUE(c.Wait(c.Push(t, keys, grads), DeadlineAfterMs(30000)).ok());
}

// Every value of every key of `t` (in Keys() order).
std::vector<float> PullAll(Client& c, const Table& t) {
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> out(keys.size() * t.spec.dim, -7.0f);
  const Status s = c.Wait(c.Pull(t, keys, out.data()), DeadlineAfterMs(30000));
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::unique_ptr<Client> Connect(const LocalCluster& cluster) {
  ClientOptions o;
  o.servers = cluster.endpoints();
  o.request_timeout_ms = 10000;
  auto c = Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

void DropsAndRecreatesEmpty(testing::LocalClusterOptions o, bool restart) {
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  auto t = c->CreateTable(SparseSpec("emb", 4));
  auto keep = c->CreateTable(SparseSpec("keep", 2));
  auto d = c->CreateTable(TableSpec::Dense("dense", 5000, {OptimizerKind::kSgd, 1.0f}));
  ASSERT_TRUE(t.ok() && keep.ok() && d.ok());
  PushOnes(*c, *t);
  PushOnes(*c, *keep);
  ASSERT_TRUE(c->Wait(c->DensePush(*d, 0, std::vector<float>(5000, -1.0f))).ok());
  for (float v : PullAll(*c, *t)) ASSERT_EQ(v, 1.0f);

  ASSERT_TRUE(c->DropTable("emb").ok());
  EXPECT_EQ(c->GetTable("emb").status().code(), StatusCode::kNotFound);
  std::vector<float> out(kKeys * 4);
  const Status gone = c->Wait(c->Pull(*t, Keys(), out.data()), DeadlineAfterMs(30000));
  EXPECT_EQ(gone.code(), StatusCode::kNotFound) << gone.ToString();
  // Dropping it again, or a table that never was: OK.
  EXPECT_TRUE(c->DropTable("emb").ok());
  EXPECT_TRUE(c->DropTable("never-created").ok());

  if (restart) {
    for (uint32_t i = 0; i < o.num_servers; ++i) {
      ASSERT_EQ(cluster.Stop(i), 0);
      ASSERT_TRUE(cluster.Restart(i).ok());
    }
    c = Connect(cluster);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->GetTable("emb").status().code(), StatusCode::kNotFound);
  }
  // Created again under the name, with another dim: every row starts from the initializer.
  auto again = c->CreateTable(SparseSpec("emb", 8));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (float v : PullAll(*c, *again)) ASSERT_EQ(v, 0.0f);
  // The other tables kept their rows.
  for (float v : PullAll(*c, *keep)) ASSERT_EQ(v, 1.0f);
  std::vector<float> dense(5000);
  ASSERT_TRUE(c->Wait(c->DensePull(*d, 0, 5000, dense.data())).ok());
  for (float v : dense) ASSERT_EQ(v, 1.0f);

  if (restart) {
    // Rows pushed to the new table survive a restart; the old ones never come back.
    PushOnes(*c, *again);
    for (uint32_t i = 0; i < o.num_servers; ++i) {
      ASSERT_EQ(cluster.Stop(i), 0);
      ASSERT_TRUE(cluster.Restart(i).ok());
    }
    c = Connect(cluster);
    ASSERT_NE(c, nullptr);
    auto back = c->GetTable("emb");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->spec.dim, 8u);
    for (float v : PullAll(*c, *back)) ASSERT_EQ(v, 1.0f);
  }
}

TEST(DropTable, MemoryServersDropAndRecreateEmpty) {
  DropsAndRecreatesEmpty(testing::Servers(2), /*restart=*/false);
}

// RocksDB with a memory budget small enough that most rows live only on disk.
TEST(DropTable, RocksDbServersDropRowsOnDiskAcrossRestarts) {
  testing::LocalClusterOptions o = testing::Servers(2);
  o.with_data_dirs = true;
  o.extra_flags = {"--memory_budget_mb=1"};
  DropsAndRecreatesEmpty(o, /*restart=*/true);
}

TEST(DropTable, RefusesAnEmptyName) {
  LocalCluster cluster(testing::Servers(1));
  ASSERT_TRUE(cluster.Start().ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->DropTable("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->DropTable(std::string(300, 'x')).code(), StatusCode::kInvalidArgument);
  // The server's own check, past the client's: a raw DropTable with no name, or one longer than
  // a table name may be, is refused with a clear error and drops nothing.
  auto keep = c->CreateTable(SparseSpec("keep", 2));
  ASSERT_TRUE(keep.ok());
  PushOnes(*c, *keep);
  testing::RawPeer peer(cluster.endpoints()[0]);
  for (const std::string& name : {std::string(), std::string(300, 'x')}) {
    Header h;
    h.op = Op::kDropTable;
    h.name = name;
    const Header r = peer.Call(h);
    EXPECT_EQ(r.status, StatusCode::kInvalidArgument) << r.message;
    EXPECT_NE(r.message.find("DropTable needs a table name"), std::string::npos) << r.message;
  }
  for (float v : PullAll(*c, *keep)) ASSERT_EQ(v, 1.0f);
}

// A crash after the drop's first write (table record gone, marker written) and before the rows
// were deleted: the next start deletes them, so the name starts empty.
TEST(DropTable, ACrashCutShortDropIsFinishedAtTheNextStart) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.with_data_dirs = true;
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  const uint64_t id = TableIdForName("emb");
  {
    auto c = Connect(cluster);
    ASSERT_NE(c, nullptr);
    auto t = c->CreateTable(SparseSpec("emb", 4));
    ASSERT_TRUE(t.ok());
    PushOnes(*c, *t);
  }
  ASSERT_EQ(cluster.Stop(0), 0);  // rows written back and flushed
  {
    // The drop's first write, as DropTable makes it, on the stopped server's store.
    StorageOptions so;
    so.data_dir = cluster.data_dir(0);
    auto engine = OpenStorageEngine(so);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const MetaWrite begin[] = {{"table/" + std::to_string(id), std::nullopt},
                               {"dropped-table/" + std::to_string(id), ""}};
    ASSERT_TRUE((*engine)->WriteMeta(begin).ok());
  }
  ASSERT_TRUE(cluster.Restart(0).ok());
  auto c = Connect(cluster);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->GetTable("emb").status().code(), StatusCode::kNotFound);
  auto again = c->CreateTable(SparseSpec("emb", 4));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (float v : PullAll(*c, *again)) ASSERT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace tessera
