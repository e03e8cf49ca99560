// Checkpoints, restores and exports of a cluster that follows a map (docs/operations.md,
// "Checkpoints"), against real tessera-server processes in a real etcd: a replicated cluster
// whose server 1 was killed and failed over (live ids 0 and 2) is checkpointed by `tessera-ctl
// checkpoint --coordinator` while two workers train; the checkpoint holds exactly the steps
// up to its cut, once per row (not the backups' copies), and restores onto a static cluster of
// two servers and onto a fresh replicated map, whose backups then hold the rows too.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ps/client/client.h"
#include "ps/client/export_reader.h"
#include "ps/record_file_internal.h"
#include "tests/cluster_fixture.h"
#include "tests/elastic/etcd_fixture.h"
#include "tests/elastic/replicated_cluster.h"

namespace tessera::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefix[] = "tessera/checkpoint-map";
constexpr size_t kKeys = 600, kDenseLength = 3000;

class CheckpointMapTest : public ReplicatedClusterTest {
 protected:
  CheckpointMapTest() : ReplicatedClusterTest(kPrefix) {}

  // The keys of the workers' pushes.
  static std::vector<uint64_t> Keys() {
    std::vector<uint64_t> keys;
    for (uint64_t k = 1; k <= kKeys; ++k) keys.push_back(k * 7919);  // over every server
    return keys;
  }

  // Worker `w` of two, asynchronous (no staleness bound): each step pushes 1 into element w
  // of every key and 1 into every dense element, then moves its clock, without waiting in
  // between (so a push may still wait for its backup when the clock arrives), and waits for
  // all three.
  class Worker {
   public:
    Worker(std::unique_ptr<Client> c, uint32_t w) : c_(std::move(c)), w_(w) {}
    Status Start() {
      if (c_ == nullptr) return Status::Internal("no client");
      TESSERA_ASSIGN_OR_RETURN(t_, c_->GetTable("emb"));
      TESSERA_ASSIGN_OR_RETURN(d_, c_->GetTable("mlp"));
      g_.assign(keys_.size() * kDim, 0.0f);
      for (size_t i = 0; i < keys_.size(); ++i) g_[i * kDim + w_] = 1.0f;
      return Status::OK();
    }
    Status Step() {
      Handle push = c_->Push(t_, keys_, g_);
      Handle dense_push = c_->DensePush(d_, 0, dense_);
      Handle clock = c_->Clock();
      TESSERA_RETURN_IF_ERROR(c_->Wait(push));
      TESSERA_RETURN_IF_ERROR(c_->Wait(dense_push));
      TESSERA_RETURN_IF_ERROR(c_->Wait(clock));
      ++steps_;
      return Status::OK();
    }
    // Steps until `stop`, and at least until it made `min_steps`; `steps` follows the count.
    void Run(int min_steps, const std::atomic<bool>& stop, std::atomic<int>* steps,
             std::atomic<bool>* failed) {
      while (steps_ < min_steps || !stop.load()) {
        if (Status st = Step(); !st.ok()) {
          ADD_FAILURE() << "worker " << w_ << " step " << steps_ << ": " << st.ToString();
          *failed = true;
          return;
        }
        steps->store(steps_);
      }
    }

   private:
    std::unique_ptr<Client> c_;
    const uint32_t w_;
    Table t_, d_;
    const std::vector<uint64_t> keys_ = Keys();
    std::vector<float> g_;
    const std::vector<float> dense_ = std::vector<float>(kDenseLength, 1.0f);
    int steps_ = 0;
  };

  // Worker `w` on a client of its own, from its first step until `stop` (Worker::Run).
  void Work(uint32_t w, int min_steps, const std::atomic<bool>& stop, std::atomic<int>* steps,
            std::atomic<bool>* failed) {
    Worker worker(CoordinatorClient(w, 2), w);
    if (Status st = worker.Start(); !st.ok()) {
      ADD_FAILURE() << "worker " << w << ": " << st.ToString();
      *failed = true;
      return;
    }
    worker.Run(min_steps, stop, steps, failed);
  }

  // The tables of the workers: "emb" (SGD, lr 1, zeros) and "mlp" (kDenseLength floats).
  void CreateTables() {
    auto c = CoordinatorClient();
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(Sparse(*c, "emb").id != 0);
    OptimizerSpec sgd;
    sgd.learning_rate = 1.0f;
    ASSERT_TRUE(c->CreateTable(TableSpec::Dense("mlp", kDenseLength, sgd)).ok());
  }

  // Every key and dense element read through `c`: worker w's element of each key is -(cut+1),
  // the others 0, each dense element -2 (cut+1).
  static void ExpectTheCut(Client& c, int64_t cut, const std::string& where) {
    auto t = c.GetTable("emb");
    auto d = c.GetTable("mlp");
    ASSERT_TRUE(t.ok() && d.ok()) << where << ": " << t.status().ToString();
    const std::vector<uint64_t> keys = Keys();
    std::vector<float> rows(keys.size() * kDim, -999.0f), dense(kDenseLength, -999.0f);
    Status st = c.Wait(c.Pull(*t, keys, rows.data()));
    ASSERT_TRUE(st.ok()) << where << ": " << st.ToString();
    st = c.Wait(c.DensePull(*d, 0, dense.size(), dense.data()));
    ASSERT_TRUE(st.ok()) << where << ": " << st.ToString();
    const float steps = static_cast<float>(cut + 1);
    size_t wrong = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      for (uint32_t e = 0; e < kDim; ++e) {
        const float want = e < 2 ? -steps : 0.0f;
        if (rows[i * kDim + e] != want && ++wrong <= 5) {
          ADD_FAILURE() << where << ": key " << keys[i] << " element " << e << " is "
                        << rows[i * kDim + e] << ", the cut at clock " << cut << " gives "
                        << want;
        }
      }
    }
    for (size_t i = 0; i < dense.size(); ++i) {
      if (dense[i] != -2 * steps && ++wrong <= 10) {
        ADD_FAILURE() << where << ": dense element " << i << " is " << dense[i]
                      << ", the cut at clock " << cut << " gives " << -2 * steps;
      }
    }
    EXPECT_EQ(wrong, 0u) << where;
  }

  // The lane files of servers `ids` under `dir` hold every key of "emb" and the one chunk of
  // "mlp" exactly once: written by their primary, not by a backup too.
  static void ExpectEachRowOnce(const std::string& dir, const std::vector<uint32_t>& ids) {
    std::map<std::pair<uint8_t, uint64_t>, int> seen;
    for (uint32_t id : ids) {
      const std::string sdir = dir + "/server-" + std::to_string(id);
      for (const auto& f : std::filesystem::directory_iterator(sdir)) {
        if (f.path().filename().string().rfind("lane-", 0) != 0) continue;
        Status st = internal::ReadRecordFile(f.path().string(), [&](const internal::Record& r) {
          ++seen[{static_cast<uint8_t>(r.kind), r.key}];
          return Status::OK();
        });
        ASSERT_TRUE(st.ok()) << st.ToString();
      }
    }
    size_t rows = 0, chunks = 0, twice = 0;
    for (const auto& [what, n] : seen) {
      (what.first == internal::Record::kSparseRow ? rows : chunks) += 1;
      if (n != 1 && ++twice <= 5) {
        ADD_FAILURE() << (what.first == internal::Record::kSparseRow ? "key " : "chunk ")
                      << what.second << " is in the checkpoint " << n << " times";
      }
    }
    EXPECT_EQ(twice, 0u);
    EXPECT_EQ(rows, kKeys);
    EXPECT_EQ(chunks, 1u);
  }

  // Checkpoint "ckpt" restored by `tessera-ctl --cluster restore` onto a static cluster of
  // two servers holds the cut (ExpectTheCut).
  void ExpectTheCutRestoredOntoTwoStaticServers(int64_t cut) {
    LocalClusterOptions o = Servers(2);
    o.admin_root = cluster_->admin_root();
    LocalCluster fixed(o);
    ASSERT_TRUE(fixed.Start().ok());
    std::string out;
    ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY,
                          "--cluster=" + fixed.endpoints()[0] + "," + fixed.endpoints()[1],
                          "restore", "ckpt"},
                         &out),
              0)
        << out;
    auto c = AdminClient(fixed.endpoints());
    ASSERT_NE(c, nullptr);
    ExpectTheCut(*c, cut, "restored onto 2 static servers");
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

TEST_F(CheckpointMapTest, ACheckpointAfterAFailoverHoldsTheCutOnceAndRestoresWithBackups) {
  CreateTables();
  std::atomic<bool> stop{false}, failed{false};
  std::atomic<int> per_worker[2] = {0, 0};
  std::vector<std::thread> workers;
  for (uint32_t w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] { Work(w, 60, stop, &per_worker[w], &failed); });
  }
  struct StopAndJoin {  // also when an assertion below returns early
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~StopAndJoin() {
      stop = true;
      for (auto& t : threads) t.join();
    }
  } joiner{stop, workers};
  auto steps = [&] { return std::min(per_worker[0].load(), per_worker[1].load()); };
  // Server 1 dies while both workers train (each made its client while every server ran):
  // its slots and dense part go to their backups, and the map's live ids become 0 and 2.
  ASSERT_TRUE(WaitFor([&] { return steps() >= 10 || failed.load(); }, seconds(60)));
  cluster_->Kill(1);
  ASSERT_TRUE(WaitForPromotion(1, seconds(60)));
  const int before = steps();
  ASSERT_TRUE(WaitFor([&] { return steps() >= before + 10 || failed.load(); }, seconds(60)));
  ASSERT_FALSE(failed.load());
  std::string out;
  const int rc = RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url_,
                             "--admin_root=" + cluster_->admin_root(), "checkpoint", "ckpt"},
                            &out, 120);
  const int at_checkpoint = steps();
  stop = true;
  for (auto& t : workers) t.join();
  workers.clear();
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(failed.load());
  long long cut = -1;
  ASSERT_EQ(std::sscanf(out.c_str(), "checkpoint written to ckpt at clock %lld", &cut), 1) << out;
  std::printf("checkpoint at clock %lld while the workers were at step %d of %d: %s", cut,
              at_checkpoint, steps(), out.c_str());
  ASSERT_GE(cut, before);  // taken while training, after the fail-over
  const std::string marker = ReadFile(cluster_->admin_root() + "/ckpt/CHECKPOINT");
  EXPECT_NE(marker.find("\nservers 2\n"), std::string::npos) << marker;
  EXPECT_NE(marker.find("\nserver_ids 0 2\n"), std::string::npos) << marker;
  EXPECT_NE(marker.find("\nmap_version "), std::string::npos) << marker;
  ExpectEachRowOnce(cluster_->admin_root() + "/ckpt", {0, 2});

  ExpectTheCutRestoredOntoTwoStaticServers(cut);

  // Onto a fresh replicated map of three: every row on its primary and its backup, so it is
  // still all there after kill -9 of server 0.
  const std::string url2 = etcd_.url("tessera/checkpoint-map-restored");
  LocalClusterOptions o = Servers(3);
  o.admin_root = cluster_->admin_root();
  auto restored = StartReplicated(url2, o);
  ASSERT_NE(restored, nullptr);
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url2, "restore", "ckpt"}, &out), 0)
      << out;
  EXPECT_NE(out.find("restored ckpt onto 3 servers"), std::string::npos) << out;
  auto c = CoordinatorClient(0, 0, url2);
  ASSERT_NE(c, nullptr);
  ExpectTheCut(*c, cut, "restored onto a replicated map");
  restored->Kill(0);
  SlotMapStore store2(client_.get(), "/tessera/checkpoint-map-restored");
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store2.Load();
        return m.ok() && std::find(m->primary.begin(), m->primary.end(), 0) == m->primary.end();
      },
      seconds(60)));
  ExpectTheCut(*c, cut, "restored onto a replicated map, read after kill -9 of server 0");
}

// A map change while the servers wait for a checkpoint's cut (worker 1 is a step behind)
// aborts it, and so does a push a server refuses by map version (its client sends it again
// after its Clock). `tessera-ctl checkpoint` takes it again at the new version, and it holds
// the cut.
TEST_F(CheckpointMapTest, AMapChangeWhileTheCutIsAwaitedAbortsItAndItIsTakenAgain) {
  CreateTables();
  std::vector<std::unique_ptr<Worker>> w;
  for (uint32_t i = 0; i < 2; ++i) {
    w.push_back(std::make_unique<Worker>(CoordinatorClient(i, 2), i));
    ASSERT_TRUE(w[i]->Start().ok());
  }
  // Worker 0 at clock 6, worker 1 at 5: the cut (after every step pushed, clock 5) waits for
  // worker 1's step 5.
  for (int s = 0; s < 6; ++s) ASSERT_TRUE(w[0]->Step().ok());
  for (int s = 0; s < 5; ++s) ASSERT_TRUE(w[1]->Step().ok());
  std::string out;
  int rc = -1;
  std::thread ctl([&] {
    rc = RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url_,
                     "--admin_root=" + cluster_->admin_root(), "checkpoint", "ckpt"},
                    &out, 120);
  });
  const bool pending = WaitFor(
      [&] {
        for (uint32_t r = 0; r < 3; ++r) {
          if (ServerStat(r, "checkpoint_pending") != 1) return false;
        }
        return true;
      },
      seconds(60));
  EXPECT_TRUE(pending) << "the servers never held the cut";
  // Version 2, the same owners and backups.
  auto m = store_->Load();
  const bool bumped = m.ok() && [&] {
    ClusterMap next = *m;
    next.version = 2;
    return store_->CompareAndSwap(1, next).ok();
  }();
  EXPECT_TRUE(bumped);
  std::atomic<bool> stop{false}, failed{false};
  std::atomic<int> steps[2] = {0, 0};
  std::vector<std::thread> workers;
  for (uint32_t i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] { w[i]->Run(0, stop, &steps[i], &failed); });
  }
  ctl.join();
  stop = true;
  for (auto& t : workers) t.join();
  for (uint32_t r = 0; r < 3; ++r) {  // the attempts, as each server logged them
    const std::string log = ReadFile(cluster_->log_path(r));
    const std::string what = "checkpoint at clock";
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) {
      std::printf("server %u: %s\n", r, log.substr(at, log.find('\n', at) - at).c_str());
    }
  }
  ASSERT_TRUE(pending && bumped);
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(failed.load());
  long long cut = -1;
  ASSERT_EQ(std::sscanf(out.c_str(), "checkpoint written to ckpt at clock %lld", &cut), 1) << out;
  const std::string marker = ReadFile(cluster_->admin_root() + "/ckpt/CHECKPOINT");
  // Taken again at version 2, as a rule; at version 1 only when every server took its snapshot
  // before it saw version 2 and refused nothing (then it is right too). What must hold either
  // way is the cut, below: a push refused as stale and sent again behind its Clock, missed by
  // a cut that was not aborted, leaves a step short.
  const bool at_two = marker.find("\nmap_version 2\n") != std::string::npos;
  EXPECT_TRUE(at_two || marker.find("\nmap_version 1\n") != std::string::npos) << marker;
  std::printf("checkpoint at clock %lld, map version %d\n", cut, at_two ? 2 : 1);
  EXPECT_NE(marker.find("\nserver_ids 0 1 2\n"), std::string::npos) << marker;
  ExpectEachRowOnce(cluster_->admin_root() + "/ckpt", {0, 1, 2});
  ExpectTheCutRestoredOntoTwoStaticServers(cut);
}

// Serving exports of a failed-over cluster: `tessera-ctl export --coordinator` writes the live
// servers' files (ids 0 and 2), each row once; a delta over it holds what changed, and
// ExportReader reads both versions exactly, with no server running. `stats` and `tables` go to
// the live servers too.
TEST_F(CheckpointMapTest, ExportsOfAFailedOverClusterReadBackExactly) {
  auto c = CoordinatorClient();
  ASSERT_NE(c, nullptr);
  const Table t = Sparse(*c, "emb");
  const std::vector<uint64_t> keys = Keys();
  std::vector<float> g(keys.size() * kDim);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(1 + i % 5);
  ASSERT_TRUE(c->Wait(c->Push(t, keys, g)).ok());
  cluster_->Kill(1);
  ASSERT_TRUE(WaitForPromotion(1, seconds(60)));
  const std::string root = cluster_->admin_root();
  auto Export = [&](bool delta) {
    std::vector<std::string> argv = {TESSERA_CTL_BINARY, "--coordinator=" + url_,
                                     "--admin_root=" + root, "export", "serving"};
    if (delta) argv.insert(argv.begin() + 1, "--delta");
    std::string out;
    EXPECT_EQ(RunCommand(argv, &out), 0) << out;
  };
  Export(false);
  // stats and tables of the map's live servers; naming the cluster twice is a usage error.
  std::string out;
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url_, "stats"}, &out), 0) << out;
  EXPECT_NE(out.find("--- server 0 (" + cluster_->endpoints()[0] + ")"), std::string::npos);
  EXPECT_NE(out.find("--- server 2 (" + cluster_->endpoints()[2] + ")"), std::string::npos);
  EXPECT_EQ(out.find("--- server 1"), std::string::npos) << out;
  ASSERT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url_, "tables"}, &out), 0) << out;
  EXPECT_NE(out.find("emb"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({TESSERA_CTL_BINARY, "--coordinator=" + url_,
                        "--cluster=" + cluster_->endpoints()[0], "stats"},
                       &out),
            2)
      << out;
  EXPECT_NE(out.find("give one"), std::string::npos) << out;
  // Half the keys change after v1.
  const std::vector<uint64_t> half(keys.begin(), keys.begin() + kKeys / 2);
  std::vector<float> g2(half.size() * kDim, 10.0f);
  ASSERT_TRUE(c->Wait(c->Push(t, half, g2)).ok());
  Export(true);
  EXPECT_NE(ReadFile(root + "/serving/v2/EXPORT").find("server_ids 0 2\n"), std::string::npos);
  for (uint64_t version : {1, 2}) {
    auto reader = ExportReader::Open(root + "/serving", version);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    std::vector<float> out(keys.size() * kDim, -999.0f);
    Status found = (*reader)->Lookup("emb", keys, out.data());
    ASSERT_TRUE(found.ok()) << found.ToString();
    size_t wrong = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const float want = -g[i] - (version == 2 && i < g2.size() ? 10.0f : 0.0f);
      if (out[i] != want && ++wrong <= 5) {
        ADD_FAILURE() << "v" << version << " float " << i << ": " << out[i] << ", want " << want;
      }
    }
    EXPECT_EQ(wrong, 0u) << "v" << version;
  }
}

}  // namespace
}  // namespace tessera::testing
