// Crash durability with real server processes: kill -9 at random moments while a client
// streams pushes; after every restart nothing acknowledged is missing and every push is
// applied wholly or not at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <random>
#include <thread>
#include <vector>

#include "ps/client/client.h"
#include "ps/server/server.h"
#include "tests/cluster_fixture.h"

namespace tessera {
namespace {

using testing::LocalCluster;

struct Outcome {
  std::atomic<int64_t> acked{0};  // pushes acknowledged
  std::atomic<int64_t> sent{0};   // pushes sent (acknowledged or not)
};

// Pushes +1 to every key, one push in flight, until `stop`; counts what was acknowledged.
// Each round trip pushes the sparse table, then the dense one (which spans chunks on both lanes).
void Stream(Client& c, const Table& t, const Table& d, const std::vector<uint64_t>& keys,
            std::atomic<bool>& stop, Outcome* out) {
  std::vector<float> grads(keys.size() * t.spec.dim, -1.0f);  // SGD lr 1: value += 1
  std::vector<float> dgrads(d.spec.length, -1.0f);
  while (!stop.load()) {
    ++out->sent;
    Status s = c.Wait(c.Push(t, keys, grads), DeadlineAfterMs(5000));
    if (s.ok()) s = c.Wait(c.DensePush(d, 0, dgrads), DeadlineAfterMs(5000));
    if (s.ok()) {
      ++out->acked;
    } else {
      // The server is gone: this push may or may not have been applied. Stop sending.
      return;
    }
  }
}

void KillLoop(const std::string& durability, int rounds, bool exact_lower_bound,
              const std::vector<std::string>& flags = {}) {
  testing::LocalClusterOptions o = testing::Servers(1);
  o.lanes = 2;
  o.with_data_dirs = true;
  o.extra_flags = {"--durability=" + durability, "--relaxed_window_ms=50"};
  o.extra_flags.insert(o.extra_flags.end(), flags.begin(), flags.end());
  LocalCluster cluster(o);
  ASSERT_TRUE(cluster.Start().ok());
  ClientOptions co;
  co.servers = cluster.endpoints();
  co.request_timeout_ms = 5000;
  // The pusher stops at the kill: this test checks what the server kept, so nothing in flight
  // may be re-sent after the restart (client retries: tests/exactly_once_test.cc).
  co.retry_for_ms = 0;
  auto created = Client::Create(co);
  ASSERT_TRUE(created.ok());
  auto& c = **created;
  OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  auto t = c.CreateTable(TableSpec::Sparse("counter", 4, sgd));
  ASSERT_TRUE(t.ok());
  auto d = c.CreateTable(TableSpec::Dense("dense_counter", 3 * 16384 + 5, sgd));
  ASSERT_TRUE(d.ok());
  std::vector<uint64_t> keys(256);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 7919 + 1;  // spread over both lanes
  std::mt19937 rng(12345);
  int64_t base = 0;  // the value every key had at the start of this round
  int64_t dense_base = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::atomic<bool> stop{false};
    Outcome out;
    std::thread pusher([&] { Stream(c, *t, *d, keys, stop, &out); });
    // Kill at a random moment, once the round has pushed something (a loaded machine may take
    // a while to reconnect after the previous restart).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (out.acked.load() < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 250));
    cluster.Kill(0);
    stop = true;
    pusher.join();
    ASSERT_TRUE(cluster.Restart(0).ok());
    // Reconnected by itself: the table and its rows come back from the data directory.
    std::vector<float> v(keys.size() * 4);
    Status s;
    for (int i = 0; i < 100; ++i) {
      s = c.Wait(c.Pull(*t, keys, v.data()), DeadlineAfterMs(5000));
      if (s.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    const float n = v[0];
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_EQ(v[i], n) << "push applied partly: element " << i << " of key " << keys[i / 4];
    }
    // The dense push of a round trip follows its sparse push: it has n or n - 1 pushes.
    std::vector<float> dv(d->spec.length);
    ASSERT_TRUE(c.Wait(c.DensePull(*d, 0, dv.size(), dv.data()), DeadlineAfterMs(5000)).ok());
    for (size_t i = 0; i < dv.size(); ++i) {
      ASSERT_EQ(dv[i], dv[0]) << "dense push applied partly: element " << i;
    }
    const int64_t dense_applied = static_cast<int64_t>(dv[0]) - dense_base;
    const int64_t applied = static_cast<int64_t>(n) - base;
    EXPECT_GT(out.acked.load(), 0) << "the round pushed nothing before the kill";
    if (exact_lower_bound) {
      EXPECT_GE(applied, out.acked.load()) << "an acknowledged push was lost";
    }
    EXPECT_LE(applied, out.sent.load());
    EXPECT_TRUE(dense_applied == applied || dense_applied == applied - 1)
        << "dense pushes " << dense_applied << " vs sparse pushes " << applied;
    if (exact_lower_bound) {
      EXPECT_GE(dense_applied, out.acked.load()) << "an acknowledged dense push was lost";
    }
    base = static_cast<int64_t>(n);
    dense_base = static_cast<int64_t>(dv[0]);
  }
}

TEST(DurabilityTest, StrictModeLosesNothingAcknowledged) { KillLoop("strict", 5, true); }

// Rows written back, marks moved and the log truncated many times per round: kills land
// between a write-back and its flush, between the flush and the truncation, and right after a
// recovery whose replayed rows are not written back yet.
TEST(DurabilityTest, StrictModeWithConstantWriteBacksLosesNothing) {
  KillLoop("strict", 6, true, {"--write_back_interval_ms=10", "--maintenance_interval_ms=30"});
}

TEST(DurabilityTest, RelaxedModeAppliesWholePushes) { KillLoop("relaxed", 3, false); }

// A data_dir holds the slots of one rank in a cluster of one size: a server of another rank or
// cluster size would serve initial values for rows stored under the other layout. Refused at
// start, naming both layouts; the right server still starts on it. A server that follows a
// cluster map may come back with a longer --cluster (the map, not the size, places its slots).
TEST(DurabilityTest, DataDirOfAnotherRankOrClusterSizeIsRefused) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("tessera-foreign-" + std::to_string(getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  auto start = [&](uint32_t rank, uint32_t servers) {
    ServerOptions o;
    o.listen = "tcp://127.0.0.1:*";
    o.rank = rank;
    o.num_servers = servers;
    o.storage.data_dir = dir;
    return Server::Create(o);
  };
  ASSERT_TRUE(start(0, 2).ok());  // created, then shut down
  auto other_size = start(0, 3);
  ASSERT_FALSE(other_size.ok());
  EXPECT_EQ(other_size.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other_size.status().message().find("rank 0 of 2 servers"), std::string::npos)
      << other_size.status().ToString();
  EXPECT_NE(other_size.status().message().find("rank 0 of 3 servers"), std::string::npos)
      << other_size.status().ToString();
  auto other_rank = start(1, 2);
  ASSERT_FALSE(other_rank.ok());
  EXPECT_NE(other_rank.status().message().find("rank 1 of 2 servers"), std::string::npos)
      << other_rank.status().ToString();
  auto same = start(0, 2);
  EXPECT_TRUE(same.ok()) << same.status().ToString();
  same = Status::Unavailable("shut down");  // before the directory goes
  // Following a cluster map (--coordinator), the map owns the slots and --cluster grows as
  // servers are added: another size is taken, another rank is not.
  auto follow = [&](uint32_t rank, uint32_t servers) {
    ServerOptions o;
    o.listen = "tcp://127.0.0.1:*";
    o.rank = rank;
    o.num_servers = servers;
    o.storage.data_dir = dir;
    o.follow_cluster_map = true;
    return Server::Create(o);
  };
  auto grown = follow(0, 3);
  EXPECT_TRUE(grown.ok()) << grown.status().ToString();
  grown = Status::Unavailable("shut down");
  auto follower_other_rank = follow(1, 3);
  EXPECT_FALSE(follower_other_rank.ok());
  std::filesystem::remove_all(dir);
}

// A push's learning-rate scale is applied by the server and logged with the push: after kill -9
// (nothing written back: every push is only in the request log) the replay applies each push
// with its own scale. SGD with lr 1 and gradient -1 on both tables: a scale s adds s.
TEST(DurabilityTest, LearningRateScaleIsAppliedAndReplayedAfterKill) {
  testing::LocalClusterOptions co = testing::Servers(1);
  co.with_data_dirs = true;
  co.extra_flags = {"--write_back_interval_ms=600000"};
  LocalCluster cluster(co);
  ASSERT_TRUE(cluster.Start().ok());
  const OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  const std::vector<uint64_t> keys = {3, 1000003, 77};
  const std::vector<float> scales = {0.5f, 0.0f, 2.0f, 0.25f};
  const float expect = 0.5f + 0.0f + 2.0f + 0.25f;
  auto read = [&](Client& c, const Table& t, const Table& d) {
    std::vector<float> rows(keys.size() * 2), dense(5);
    EXPECT_TRUE(c.Wait(c.Pull(t, keys, rows.data())).ok());
    EXPECT_TRUE(c.Wait(c.DensePull(d, 0, dense.size(), dense.data())).ok());
    rows.insert(rows.end(), dense.begin(), dense.end());
    return rows;
  };
  {
    ClientOptions o;
    o.servers = cluster.endpoints();
    auto c = Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto t = (*c)->CreateTable(TableSpec::Sparse("scaled", 2, sgd));
    auto d = (*c)->CreateTable(TableSpec::Dense("scaled_dense", 5, sgd));
    ASSERT_TRUE(t.ok() && d.ok());
    EXPECT_EQ((*c)->SetLearningRateScale(-1.0f).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*c)->SetLearningRateScale(std::nanf("")).code(), StatusCode::kInvalidArgument);
    const std::vector<float> grads(keys.size() * 2, -1.0f), dgrads(5, -1.0f);
    for (float s : scales) {
      ASSERT_TRUE((*c)->SetLearningRateScale(s).ok());
      ASSERT_TRUE((*c)->Wait((*c)->Push(*t, keys, grads)).ok());
      ASSERT_TRUE((*c)->Wait((*c)->DensePush(*d, 0, dgrads)).ok());
    }
    for (float v : read(**c, *t, *d)) EXPECT_FLOAT_EQ(v, expect);
  }
  cluster.Kill(0);
  ASSERT_TRUE(cluster.Restart(0).ok());
  ClientOptions o;
  o.servers = cluster.endpoints();
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto t = (*c)->GetTable("scaled");
  auto d = (*c)->GetTable("scaled_dense");
  ASSERT_TRUE(t.ok() && d.ok());
  for (float v : read(**c, *t, *d)) EXPECT_FLOAT_EQ(v, expect) << "after replay";
}

// Damage in the middle of the request log, with acknowledged pushes logged after it, is not a
// torn tail: the restarted server refuses to start (it cut all of them off before), names the
// file and byte, and `tessera-server --repair_log` keeps every push that verifies.
TEST(DurabilityTest, CorruptionInTheMiddleOfTheLogIsRefusedAndRepaired) {
  testing::LocalClusterOptions co = testing::Servers(1);
  co.with_data_dirs = true;
  co.extra_flags = {"--write_back_interval_ms=600000"};  // every push stays in the log
  LocalCluster cluster(co);
  ASSERT_TRUE(cluster.Start().ok());
  const OptimizerSpec sgd{.kind = OptimizerKind::kSgd, .learning_rate = 1.0f};
  constexpr uint64_t kPushes = 40;
  {
    ClientOptions o;
    o.servers = cluster.endpoints();
    auto c = Client::Create(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto t = (*c)->CreateTable(TableSpec::Sparse("logged", 4, sgd));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const std::vector<float> grads(4, -1.0f);  // value += 1
    for (uint64_t k = 0; k < kPushes; ++k) {
      const std::vector<uint64_t> key = {k};
      ASSERT_TRUE((*c)->Wait((*c)->Push(*t, key, grads)).ok());
    }
  }
  cluster.Kill(0);
  // The request log: one segment; flip 8 payload bytes of its 10th record.
  std::vector<std::string> segments;
  for (const auto& e : std::filesystem::directory_iterator(cluster.data_dir(0) + "/request-log")) {
    if (e.path().extension() == ".tlog") segments.push_back(e.path().string());
  }
  ASSERT_EQ(segments.size(), 1u);
  std::string bytes;
  {
    std::ifstream in(segments[0], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  uint64_t at = 0;
  for (int r = 0; r < 9; ++r) {
    ASSERT_LE(at + 24, bytes.size());
    uint32_t len;
    std::memcpy(&len, bytes.data() + at + 4, 4);
    at += 24 + len;
  }
  ASSERT_LT(at + 24 + 16, bytes.size());
  for (int i = 0; i < 8; ++i) bytes[at + 24 + 8 + i] ^= 0x5a;
  {
    std::ofstream out(segments[0], std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_FALSE(cluster.Restart(0).ok()) << "a corrupt log must not be cut and served";
  EXPECT_EQ(std::filesystem::file_size(segments[0]), bytes.size()) << "nothing may be cut";
  {
    std::ifstream in(cluster.log_path(0));
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_NE(ss.str().find("at byte " + std::to_string(at)), std::string::npos) << ss.str();
    EXPECT_NE(ss.str().find("--repair_log"), std::string::npos) << ss.str();
  }
  std::string output;
  ASSERT_EQ(testing::RunCommand({TESSERA_SERVER_BINARY, "--repair_log",
                                 "--data_dir=" + cluster.data_dir(0)},
                                &output),
            0)
      << output;
  EXPECT_NE(output.find("kept " + std::to_string(kPushes - 1) + " records, lost 1"),
            std::string::npos)
      << output;
  ASSERT_TRUE(cluster.Restart(0).ok());
  ClientOptions o;
  o.servers = cluster.endpoints();
  auto c = Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto t = (*c)->GetTable("logged");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  uint64_t applied = 0;
  for (uint64_t k = 0; k < kPushes; ++k) {
    const std::vector<uint64_t> key = {k};
    std::vector<float> row(4);
    ASSERT_TRUE((*c)->Wait((*c)->Pull(*t, key, row.data())).ok());
    if (row[0] == 1.0f) ++applied;
  }
  // Every push but the damaged one (the 10th logged) survived.
  EXPECT_EQ(applied, kPushes - 1);
}

}  // namespace
}  // namespace tessera
