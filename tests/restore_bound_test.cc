// Restore's back-pressure (real server processes): the checkpoint reader queues at most
// --restore_max_queued_batches batches to the lanes, every row still comes back exactly, and a
// server stopped in the middle of a restore gives it up instead of reading on.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/codec.h"
#include "ps/initializer.h"
#include "tests/cluster_fixture.h"
#include "tests/raw_peer.h"
#include "tests/spawn.h"

namespace tessera {
namespace {

using testing::LocalCluster;
using testing::StatValue;

constexpr uint32_t kDim = 8;
constexpr uint64_t kRows = 100000;
constexpr uint64_t kDenseLength = 40000;  // three dense chunks

std::unique_ptr<Client> Connect(const LocalCluster& c) {
  ClientOptions o;
  o.admin_root = c.admin_root();
  return testing::ConnectClient(c, o);
}

std::vector<uint64_t> AllKeys() {
  std::vector<uint64_t> keys(kRows);
  for (uint64_t k = 0; k < kRows; ++k) keys[k] = k * 7919 + 3;  // spread over the slots
  return keys;
}

// Every row's values, then the dense tensor.
std::vector<float> Dump(Client& c, const Table& emb, const Table& mlp) {
  const auto keys = AllKeys();
  std::vector<float> out(keys.size() * kDim + kDenseLength);
  EXPECT_TRUE(c.Wait(c.Pull(emb, keys, out.data())).ok());
  EXPECT_TRUE(c.Wait(c.DensePull(mlp, 0, kDenseLength, out.data() + keys.size() * kDim)).ok());
  return out;
}

// One push of gradients derived from `values` (a Dump): the result depends on the optimizer
// state as well as on the values.
void Step(Client& c, const Table& emb, const Table& mlp, const std::vector<float>& values) {
  const auto keys = AllKeys();
  std::vector<float> g(values.begin(), values.begin() + keys.size() * kDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] - 0.01f * static_cast<float>(i % 5);
  ASSERT_TRUE(c.Wait(c.Push(emb, keys, g)).ok());
  std::vector<float> d(values.begin() + keys.size() * kDim, values.end());
  for (size_t i = 0; i < d.size(); ++i) d[i] = d[i] + 0.001f * static_cast<float>(i % 7);
  ASSERT_TRUE(c.Wait(c.DensePush(mlp, 0, d)).ok());
}

// Cluster `a` gets kRows trained rows and a dense tensor, checkpointed as "ckpt"; returns
// their values at the checkpoint.
std::vector<float> TrainAndCheckpoint(LocalCluster& a) {
  auto c = Connect(a);
  if (c == nullptr) return {};
  OptimizerSpec adagrad{.kind = OptimizerKind::kAdagrad, .learning_rate = 0.1f};
  OptimizerSpec adam{.kind = OptimizerKind::kAdam, .learning_rate = 0.01f};
  auto emb = c->CreateTable(
      TableSpec::Sparse("emb", kDim, adagrad, {InitializerKind::kNormal, 0.0f, 0.1f, 5}));
  auto mlp = c->CreateTable(
      TableSpec::Dense("mlp", kDenseLength, adam, {InitializerKind::kUniform, -0.1f, 0.1f, 6}));
  EXPECT_TRUE(emb.ok() && mlp.ok());
  if (!emb.ok() || !mlp.ok()) return {};
  Step(*c, *emb, *mlp, Dump(*c, *emb, *mlp));
  auto cut = c->Checkpoint("ckpt");
  EXPECT_TRUE(cut.ok()) << cut.status().ToString();
  return Dump(*c, *emb, *mlp);
}

TEST(RestoreBound, ARestoreOfManyTimesTheBoundQueuesAtMostTheBoundAndBringsBackEveryRow) {
  LocalCluster a(testing::Servers(2));
  ASSERT_TRUE(a.Start().ok());
  const std::vector<float> before = TrainAndCheckpoint(a);
  ASSERT_FALSE(before.empty());

  // 100,000 rows in batches of 64: some 1,560 batches through a bound of 2.
  testing::LocalClusterOptions b_opts = testing::Servers(1);
  b_opts.admin_root = a.admin_root();
  b_opts.extra_flags = {"--restore_batch_rows=64", "--restore_max_queued_batches=2"};
  LocalCluster b(b_opts);
  ASSERT_TRUE(b.Start().ok());
  auto cb = Connect(b);
  ASSERT_NE(cb, nullptr);
  Status rs = cb->Restore("ckpt");
  ASSERT_TRUE(rs.ok()) << rs.ToString();
  auto stats = cb->ServerStats(0);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const int64_t most = StatValue(*stats, "restore_queued_batches_max");
  EXPECT_GE(most, 1) << *stats;
  EXPECT_LE(most, 2) << *stats;
  std::printf("restore: at most %lld batches queued, the reader waited %lld times\n",
              static_cast<long long>(most),
              static_cast<long long>(StatValue(*stats, "restore_back_pressure_waits")));

  // Every value exactly, and the optimizer state: the same step on both gives the same rows.
  auto emb = cb->GetTable("emb");
  auto mlp = cb->GetTable("mlp");
  ASSERT_TRUE(emb.ok() && mlp.ok());
  const std::vector<float> restored = Dump(*cb, *emb, *mlp);
  ASSERT_EQ(restored.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(restored[i], before[i]) << "float " << i;
  auto ca = Connect(a);
  ASSERT_NE(ca, nullptr);
  auto a_emb = ca->GetTable("emb");
  auto a_mlp = ca->GetTable("mlp");
  ASSERT_TRUE(a_emb.ok() && a_mlp.ok());
  Step(*ca, *a_emb, *a_mlp, before);
  Step(*cb, *emb, *mlp, restored);
  const std::vector<float> a_after = Dump(*ca, *a_emb, *a_mlp);
  const std::vector<float> b_after = Dump(*cb, *emb, *mlp);
  for (size_t i = 0; i < a_after.size(); ++i) {
    ASSERT_EQ(b_after[i], a_after[i]) << "float " << i << " after a step";
  }
}

TEST(RestoreBound, AServerStoppedInTheMiddleOfARestoreGivesItUpAndExits) {
  LocalCluster a(testing::Servers(2));
  ASSERT_TRUE(a.Start().ok());
  ASSERT_FALSE(TrainAndCheckpoint(a).empty());

  // One row per batch, one batch queued, rows committed to RocksDB: a long restore.
  testing::LocalClusterOptions c_opts = testing::Servers(1);
  c_opts.admin_root = a.admin_root();
  c_opts.with_data_dirs = true;
  c_opts.extra_flags = {"--restore_batch_rows=1", "--restore_max_queued_batches=1"};
  LocalCluster c(c_opts);
  ASSERT_TRUE(c.Start().ok());
  // Sent without waiting for the answer: the server is stopped before it gives one.
  testing::RawPeer peer(c.endpoints()[0]);
  Header h;
  h.op = Op::kRestore;
  h.name = "ckpt";
  ASSERT_TRUE(peer.Send(h));
  const auto t0 = std::chrono::steady_clock::now();
  while (testing::ReadLog(c.log_path(0)).find("restoring from") == std::string::npos) {
    ASSERT_LT(testing::MsSince(t0), 30000) << testing::ReadLog(c.log_path(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(c.Stop(0, 30), 0) << testing::ReadLog(c.log_path(0));
  const std::string log = testing::ReadLog(c.log_path(0));
  const size_t stopped = log.find("stopped after");
  ASSERT_NE(stopped, std::string::npos) << log;
  std::printf("restore %s\n", log.substr(stopped, log.find('\n', stopped) - stopped).c_str());
  EXPECT_NE(log.find("the server is stopping"), std::string::npos) << log;
  EXPECT_EQ(log.find("restored "), std::string::npos) << log;
}

}  // namespace
}  // namespace tessera
